"""Generated sources for typed features: a labelled text corpus and numeric-plus-ID rows.

Each is built so that a simpler model's shortcut does not work: in ``text`` the class is *who
does something*, so only word order tells it; in ``mixed`` part of the target comes from random
per-ID effects that no function of an ID's number recovers. Both are reproducible from
``seed``. (``generator: tabular`` is scikit-learn's, in :mod:`dbspec.sources.synthetic`.)
"""

from __future__ import annotations

import numpy as np

#: Largest class count of the text generator: every document names one actor of each class.
TEXT_MAX_CLASSES = 10
TEXT_MAX_TOKENS = 40
_TEXT_MIN_TOKENS = 5  # the action sentence alone has 6
_ACTORS_PER_CLASS = 6
_VERBS = 5
_FILLER_WORDS = 300
_PREPOSITIONS = ("near", "with", "beside", "behind", "after")
_FUNCTION_WORDS = ("a", "of", "to", "in", "it", "was", "is", "on", "so", "but")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"

#: Shares of the mixed generator's latent score (each part has unit variance; they add to 1).
MIXED_SHARES = {"numeric": 0.40, "user": 0.25, "item": 0.15, "user_x_category": 0.20}
MIXED_ITEM_CATEGORIES = 8
_POPULARITY_EXPONENT = 0.7


def generate_text(source, by_words: bool = False):
    """A labelled corpus: columns ``text`` (str) and ``target`` (int64 class 0..classes-1).

    Every document names one *actor* of each class's six; one sentence is an action,
    ``the <actor> <verb>ed the <actor>``, and the class is that of the actor before the verb.
    The others appear as objects or bystanders, so a bag of words sits at chance and word pairs
    recover the class. Zipf-distributed filler fills 6 to 40 tokens (punctuation counted, at
    least ``3 x classes + 1``). ``noise`` (capped at 0.5) of the labels are then replaced by
    another class. ``features``, ``informative`` and ``cardinality`` are not used; the caller
    has refused a regression task and more than :data:`TEXT_MAX_CLASSES` classes.
    ``by_words`` (``generator: text_words``): every actor named is of the document's class, so
    the words used tell the class and a bag of words recovers it.
    """
    import pandas as pd

    classes = source.classes
    rng = np.random.default_rng(source.seed)
    vocabulary = _Vocabulary(rng, classes)
    labels = rng.integers(0, classes, size=source.rows)
    texts = [_document(rng, vocabulary, int(label), classes, by_words) for label in labels]
    target = _flip_labels(rng, labels, classes, source.noise)
    return pd.DataFrame({"text": pd.Series(texts, dtype="str"), "target": target})


def generate_mixed(source, task: str):
    """Numeric columns ``f0..`` (float32), string ID columns ``user_id`` (``cardinality``
    values) and ``item_id`` (``cardinality // 4``, at least 2), and ``target``.

    IDs have power-law popularity (exponent 0.7) in shuffled order, and effects drawn apart
    from their numbers. A unit-variance score adds, by :data:`MIXED_SHARES`: a linear function
    of the first ``informative`` numeric columns (default up to 10), a per-user and a per-item
    effect, and each user's taste for 8 hidden item categories; the numeric columns alone
    explain at most 40% of it. regression: ``score + noise * N(0, 1)`` (float32);
    classification: the score cut at its quantiles into equally frequent classes (int64),
    then ``noise`` (capped at 0.5) of the labels flipped.
    """
    import pandas as pd

    rng = np.random.default_rng(source.seed)
    rows, n_users = source.rows, source.cardinality
    n_items = max(2, n_users // 4)
    informative = min(source.informative or min(source.features, 10), source.features)
    x = rng.standard_normal((rows, source.features))
    weights = rng.standard_normal(informative)
    numeric = x[:, :informative] @ (weights / np.linalg.norm(weights))
    users = _draw_ids(rng, n_users, rows)
    items = _draw_ids(rng, n_items, rows)
    category = rng.integers(0, MIXED_ITEM_CATEGORIES, size=n_items)
    user_effect = rng.standard_normal(n_users)
    item_effect = rng.standard_normal(n_items)
    taste = rng.standard_normal((n_users, MIXED_ITEM_CATEGORIES))
    parts = {"numeric": numeric, "user": user_effect[users], "item": item_effect[items],
             "user_x_category": taste[users, category[items]]}
    score = sum(np.sqrt(MIXED_SHARES[name]) * part for name, part in parts.items())

    frame = pd.DataFrame(x.astype(np.float32),
                         columns=[f"f{i}" for i in range(source.features)])
    frame["user_id"] = pd.Series(_id_names("u", n_users)[users], dtype="str")
    frame["item_id"] = pd.Series(_id_names("i", n_items)[items], dtype="str")
    if task == "regression":
        noisy = score + source.noise * rng.standard_normal(rows)
        frame["target"] = noisy.astype(np.float32)
    else:
        cuts = np.quantile(score, np.arange(1, source.classes) / source.classes)
        labels = np.searchsorted(cuts, score, side="right")
        frame["target"] = _flip_labels(rng, labels, source.classes, source.noise)
    return frame


def _flip_labels(rng, labels: np.ndarray, classes: int, noise: float) -> np.ndarray:
    """Replace ``noise`` (capped at 0.5) of the labels by another class, drawn uniformly."""
    labels = labels.astype(np.int64)
    flipped = rng.permutation(len(labels))[:round(min(noise, 0.5) * len(labels))]
    labels[flipped] = (labels[flipped] + rng.integers(1, classes, size=len(flipped))) % classes
    return labels


def _draw_ids(rng, count: int, rows: int) -> np.ndarray:
    """Row IDs with power-law popularity; which ID is popular is random, not its number."""
    popularity = np.arange(1, count + 1, dtype=np.float64) ** -_POPULARITY_EXPONENT
    popularity = rng.permutation(popularity)
    return rng.choice(count, size=rows, p=popularity / popularity.sum())


def _id_names(prefix: str, count: int) -> np.ndarray:
    width = len(str(count - 1))
    return np.array([f"{prefix}{i:0{width}d}" for i in range(count)], dtype=object)


class _Vocabulary:
    """Generated words of one corpus: actors per class, verbs, filler with Zipf weights."""

    def __init__(self, rng, classes: int):
        words = _invent_words(rng, classes * _ACTORS_PER_CLASS + _VERBS + _FILLER_WORDS)
        self.actors = [words[c * _ACTORS_PER_CLASS:(c + 1) * _ACTORS_PER_CLASS]
                       for c in range(classes)]
        start = classes * _ACTORS_PER_CLASS
        self.verbs = [word + "ed" for word in words[start:start + _VERBS]]
        self.filler = np.array(list(_FUNCTION_WORDS) + words[start + _VERBS:], dtype=object)
        weights = 1.0 / np.arange(10, len(self.filler) + 10)  # Zipf, flattened at the top
        self.filler_cdf = np.cumsum(weights) / weights.sum()


def _invent_words(rng, count: int) -> list[str]:
    """``count`` distinct pronounceable words of 2-3 syllables, none a function word."""
    reserved = set(_FUNCTION_WORDS) | set(_PREPOSITIONS) | {"the", "and"}
    words: list[str] = []
    seen = set(reserved)
    while len(words) < count:
        syllables = int(rng.integers(2, 4))
        word = "".join(_CONSONANTS[rng.integers(len(_CONSONANTS))] +
                       _VOWELS[rng.integers(len(_VOWELS))] for _ in range(syllables))
        if rng.random() < 0.3:
            word += _CONSONANTS[rng.integers(len(_CONSONANTS))]
        # a verb is a word + "ed": keep every word and its -ed form distinct, and "-ed" a
        # mark of verbs only (a subword tokenizer may learn it)
        if word not in seen and word + "ed" not in seen and not word.endswith("ed"):
            seen.update((word, word + "ed"))
            words.append(word)
    return words


def _document(rng, vocabulary: _Vocabulary, label: int, classes: int, by_words: bool) -> str:
    """One document of ``label``: an action sentence, a bystander sentence, filler sentences.
    The token count is drawn first; what the fixed tokens leave goes to filler."""
    others = [c for c in range(classes) if c != label]
    rng.shuffle(others)
    actor = [vocabulary.actors[label if by_words else c][rng.integers(_ACTORS_PER_CLASS)]
             for c in range(classes)]
    verb = vocabulary.verbs[rng.integers(_VERBS)]
    action = ["the", actor[label], verb, "the", actor[others[0]]]
    bystanders = [actor[c] for c in others[1:]]

    fixed = len(action) + 1 + (3 * len(bystanders) + 1 if bystanders else 0)
    length = int(rng.integers(max(_TEXT_MIN_TOKENS, fixed), TEXT_MAX_TOKENS + 1))
    spare = length - fixed
    slots = [0, 0, 0]  # filler words before the action, after it, before the bystanders
    filler_sentences: list[int] = []
    while spare > 0:
        if spare >= 3 and rng.random() < 0.5:
            size = int(rng.integers(3, min(spare, 12) + 1))
            filler_sentences.append(size)
            spare -= size
        else:
            slots[rng.integers(3 if bystanders else 2)] += 1
            spare -= 1

    sentences = [_words(rng, vocabulary, slots[0]) + action + _words(rng, vocabulary, slots[1])
                 + [_end(rng)]]
    if bystanders:
        listed = ["the", bystanders[0]]
        for i, name in enumerate(bystanders[1:], start=2):
            listed += ["and" if i == len(bystanders) else ",", "the", name]
        preposition = _PREPOSITIONS[rng.integers(len(_PREPOSITIONS))]
        sentences.append(_words(rng, vocabulary, slots[2]) + [preposition] + listed
                         + [_end(rng)])
    sentences += [_filler_sentence(rng, vocabulary, size) for size in filler_sentences]
    order = rng.permutation(len(sentences))
    return " ".join(_render(sentences[i]) for i in order)


def _words(rng, vocabulary: _Vocabulary, count: int) -> list[str]:
    if count == 0:
        return []
    drawn = np.searchsorted(vocabulary.filler_cdf, rng.random(count), side="right")
    return vocabulary.filler[np.minimum(drawn, len(vocabulary.filler) - 1)].tolist()


def _filler_sentence(rng, vocabulary: _Vocabulary, size: int) -> list[str]:
    """``size`` tokens: filler words, sometimes a comma inside, and an end mark."""
    tokens = _words(rng, vocabulary, size - 1)
    if size >= 6 and rng.random() < 0.4:
        tokens[int(rng.integers(2, size - 3))] = ","
    return tokens + [_end(rng)]


def _end(rng) -> str:
    draw = rng.random()
    return "." if draw < 0.8 else "!" if draw < 0.9 else "?"


def _render(tokens: list[str]) -> str:
    """Tokens as a sentence: punctuation attached to the word before it, first word capital."""
    text = tokens[0].capitalize()
    for token in tokens[1:]:
        text += token if token in ",.!?" else " " + token
    return text
