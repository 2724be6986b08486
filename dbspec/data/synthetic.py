"""Generated sources for typed features: a labelled text corpus and numeric-plus-ID rows.

``data.source.generator: tabular`` stays in :mod:`dbspec.data.sources` (scikit-learn's
generators, unchanged so existing runs read the same rows). The two generators here exist to
exercise the typed encoders, so each is built so that the shortcut a simpler model would take
does not work:

* ``text``: the class is *who does something* in one sentence, so the words alone do not tell
  it; only their order does (see :func:`generate_text`).
* ``mixed``: part of the target comes from random per-ID effects of two high-cardinality ID
  columns, which no function of the ID's number can recover (see :func:`generate_mixed`).

Both are reproducible from ``seed`` (numpy's ``default_rng``) and the other source settings.
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


def generate_text(source):
    """A labelled corpus: columns ``text`` (str) and ``target`` (int64 class 0..classes-1).

    Every document mentions exactly one *actor* word of every class's group of actors (six
    generated nouns per class). One sentence has an action, ``the <actor> <verb>ed the
    <actor>``; the class is the group of the actor before the verb. The other actors appear
    as objects or bystanders (``near the <actor>, the <actor> and the <actor>``). So the set
    of words of a document has the same distribution in every class: a bag of words sits at
    chance. Which actor stands directly before a verb decides the class, so word pairs (a
    bigram model, a recurrent or attention encoder) recover it.

    Filler words (300 generated words and a few function words, Zipf-distributed) make up the
    rest, in sentences with commas and ``.``, ``!`` or ``?``; a document has 6 to 40 tokens,
    punctuation counted (at least ``3 x classes + 1`` from 3 classes on, to fit every actor).
    ``noise`` is the fraction of labels (capped at 0.5) replaced by another class, after the
    text is written. ``features``, ``informative`` and ``cardinality`` are not used.

    The caller (:func:`dbspec.data.sources.read_source`) has refused a regression task and
    more than :data:`TEXT_MAX_CLASSES` classes with a located error.
    """
    import pandas as pd

    classes = source.classes
    rng = np.random.default_rng(source.seed)
    vocabulary = _Vocabulary(rng, classes)
    labels = rng.integers(0, classes, size=source.rows)
    texts = [_document(rng, vocabulary, int(label), classes) for label in labels]
    target = _flip_labels(rng, labels, classes, source.noise)
    return pd.DataFrame({"text": pd.Series(texts, dtype="str"), "target": target})


def generate_mixed(source, task: str):
    """Numeric columns ``f0..`` (float32), ID columns ``user_id`` and ``item_id`` (strings),
    and ``target``.

    ``user_id`` takes ``cardinality`` values ``u0000..``, ``item_id`` ``cardinality // 4``
    (at least 2) values ``i000..``, zero-padded to one width per column. IDs are strings so
    that they are read as categorical: their numbers carry nothing (each ID's effect is drawn
    independently of its number), and their popularity follows a mild power law (exponent
    0.7) over IDs in shuffled order.

    A latent score with unit variance adds four parts, each scaled to its share
    (:data:`MIXED_SHARES`): a linear function of the first ``informative`` numeric columns
    (default: up to 10; the rest are noise columns), a random effect per user, a random
    effect per item, and a user x item-category interaction (each user's taste for each of 8
    hidden item categories). A model on the numeric columns alone explains at most 40% of
    it; learning the per-ID effects (an embedding, a target encoding) explains the rest.

    regression: ``target = score + noise * N(0, 1)`` (float32). binary / multiclass: the
    score is cut at its quantiles into ``classes`` equally frequent, ordered classes
    (int64), then ``noise`` (capped at 0.5) of the labels are replaced by another class.
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


def _document(rng, vocabulary: _Vocabulary, label: int, classes: int) -> str:
    """One document of ``label``: an action sentence, a bystander sentence, filler sentences.

    Tokens (words and punctuation) are planned first: the fixed ones, then a length drawn up
    to 40, whose remainder goes to filler words and whole filler sentences.
    """
    others = [c for c in range(classes) if c != label]
    rng.shuffle(others)
    actor = [vocabulary.actors[c][rng.integers(_ACTORS_PER_CLASS)] for c in range(classes)]
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
