"""Networks over typed features: encoders, combiners, padding masks, image augmentation and
ResNet weights (:mod:`dbspec.models.typed`, :mod:`dbspec.models.resnet`)."""

from __future__ import annotations

import pytest
import torch
from pydantic import TypeAdapter

from dbspec.models.network import ModelError, build_network
from dbspec.models.resnet import ResNetBody
from dbspec.models.typed import TypedNetwork
from dbspec.spec.layout import combined_width, encoded_inputs, encoder_width
from dbspec.spec.sections.features import TypedFeature
from dbspec.spec.sections.network import ModelSpec
from tests.helpers.threads import one_thread  # noqa: F401  (a fixture)


pytestmark = pytest.mark.usefixtures("one_thread")


def fitted(name, type_, n_columns, indices=None, **spec):
    """One fitted input as the model card stores it."""
    entry = {"name": name, "type": type_, "spec": {"name": name, "type": type_, **spec},
             "columns": [f"{name}.{i}" for i in range(n_columns)]}
    if indices is not None:
        entry["indices"] = indices
    return entry


def model(layers=None, **settings):
    return ModelSpec.model_validate({"layers": layers or [{"linear": {"out": 2}}], **settings})


def build(inputs, out=2, load_weights=False, **settings):
    width = sum(len(entry["columns"]) for entry in inputs)
    return build_network(model(**settings), width, out, inputs, load_weights=load_weights)


def texts(rows, length):
    """Token-id rows padded with 0 to ``length`` columns."""
    return torch.tensor([row + [0] * (length - len(row)) for row in rows], dtype=torch.float32)


TEXT = fitted("text", "text", 10, indices=30, max_length=10)
TEXT_ENCODERS = {
    "bag": {"kind": "bag", "dim": 8},
    "lstm": {"kind": "lstm", "dim": 8, "hidden": 6, "bidirectional": True, "pool": "mean"},
    "lstm_last": {"kind": "lstm", "dim": 8, "hidden": 6, "layers": 2},
    "gru": {"kind": "gru", "dim": 8, "hidden": 6, "pool": "max"},
    "transformer": {"kind": "transformer", "dim": 8, "heads": 2, "layers": 2},
}


@pytest.mark.parametrize("combiner", ["concat", "attention"])
@pytest.mark.parametrize("text_encoder", sorted(TEXT_ENCODERS))
def test_widths_are_those_of_the_layout(text_encoder, combiner):
    torch.manual_seed(0)
    inputs = [fitted("x", "numeric", 1), fitted("city", "categorical", 1, indices=5),
              TEXT, fitted("series", "sequence", 6, max_length=6),
              fitted("photo", "image", 3 * 12 * 12, height=12, width=12),
              fitted("y", "numeric", 1)]
    settings = {"encoders": {"text": TEXT_ENCODERS[text_encoder],
                             "series": {"kind": "gru", "hidden": 5},
                             "photo": {"kind": "cnn", "channels": [4, 8]}},
                "combiner": combiner}
    network = build(inputs, **settings)
    assert isinstance(network, TypedNetwork)
    spec = model(**settings)
    features = [TypeAdapter(TypedFeature).validate_python(e["spec"]) for e in inputs]
    encoded = encoded_inputs(features, spec)
    widths = {item.name: encoder_width(item) for item in encoded}
    x = torch.cat([torch.randn(4, 1), torch.tensor([[1.0], [4.0], [0.0], [2.0]]),
                   texts([[3, 4, 5], [1], [], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7]], 10),
                   torch.randn(4, 6), torch.randn(4, 432), torch.randn(4, 1)], dim=1)
    network.eval()
    with torch.no_grad():
        vectors = network.encoded(x)
        out = network(x)
    assert {name: tuple(v.shape) for name, v in vectors.items()} == {
        name: (4, width) for name, width in widths.items()}
    assert network.head[0].in_features == combined_width(2, list(widths.values()),
                                                         spec.combiner)
    assert out.shape == (4, 2) and torch.isfinite(out).all()


def encoder_of(network, name):
    return next(e for e in network.encoders if e.name == name)


@pytest.mark.parametrize("text_encoder", sorted(TEXT_ENCODERS))
def test_padding_does_not_change_the_encoding(text_encoder):
    torch.manual_seed(1)
    network = build([TEXT], encoders={"text": TEXT_ENCODERS[text_encoder]}).eval()
    encoder = encoder_of(network, "text")
    row = [5, 3, 9, 2]
    with torch.no_grad():
        alone = encoder(texts([row], 4))  # no padding at all
        padded = encoder(texts([row], 10))
        shorter = encoder(texts([row], 7))
        in_batch = encoder(texts([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], row, [8]], 10))[1:2]
    for other in (padded, shorter, in_batch):
        torch.testing.assert_close(other, alone, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layers", [
    [{"embedding": {"dim": 8}}, {"transformer_encoder": {"heads": 2}}, {"global_pool": {"op": "max"}}],
    [{"embedding": {"dim": 8}}, {"multihead_attention": {"heads": 4}}, "layer_norm",
     {"global_pool": {"op": "last"}}],
    [{"embedding": {"dim": 8}}, {"lstm": {"hidden": 4, "bidirectional": True}},
     {"global_pool": {"op": "first"}}],
], ids=["transformer", "attention", "lstm"])
def test_rows_of_padding_alone_stay_finite(layers):
    torch.manual_seed(2)
    network = build([fitted("n", "numeric", 1), TEXT],
                    encoders={"text": {"kind": "layers", "layers": layers}})
    x = torch.cat([torch.ones(3, 1), texts([[], [4, 5], []], 10)], dim=1)
    for training in (True, False):
        network.train(training)
        out = network(x)
        assert torch.isfinite(out).all()
        out.sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in network.parameters()
                   if p.grad is not None)


@pytest.mark.parametrize("kind", ["gru", "bag"])
def test_numeric_sequences_mask_their_nan_padding(kind):
    torch.manual_seed(3)
    network = build([fitted("series", "sequence", 6, max_length=6)],
                    encoders={"series": {"kind": kind, "dim": 4}}).eval()
    encoder = encoder_of(network, "series")
    nan = float("nan")
    with torch.no_grad():
        padded = encoder(torch.tensor([[0.5, -1.0, 2.0, nan, nan, nan]]))
        alone = encoder(torch.tensor([[0.5, -1.0, 2.0]]))
        zeros = encoder(torch.tensor([[0.5, -1.0, 2.0, 0.0, 0.0, 0.0]]))
    assert torch.isfinite(padded).all()
    torch.testing.assert_close(padded, alone, rtol=0, atol=1e-6)
    assert not torch.allclose(padded, zeros, atol=1e-4)  # a 0 reading is not padding


def image_input(augment, channels=1, normalize="unit"):
    return fitted("photo", "image", channels * 16 * 12, height=16, width=12, channels=channels,
                  normalize=normalize, augment=augment)


def test_augmentation_only_in_training():
    torch.manual_seed(4)
    augment = {"flip": True, "rotate": 20, "translate": 0.1, "scale": 0.2, "brightness": 0.3}
    network = build([image_input(augment, channels=3, normalize="imagenet")])
    layer = encoder_of(network, "photo").augment
    x = torch.randn(8, 3, 16, 12)
    changed = layer(x)
    assert changed.shape == x.shape and torch.isfinite(changed).all()
    assert all(not torch.allclose(changed[i], x[i]) for i in range(8))
    network.eval()
    assert torch.equal(layer(x), x)
    matrix = x.reshape(8, -1)
    with torch.no_grad():
        torch.testing.assert_close(network(matrix), network(matrix))


def test_flips_mirror_exactly_and_brightness_scales_raw_pixels():
    torch.manual_seed(5)
    x = torch.rand(16, 1, 16, 12)
    flip = encoder_of(build([image_input({"flip": True})]), "photo").augment
    out = flip(x)
    mirrored = [torch.allclose(o, x[i].flip(-1), atol=1e-5) for i, o in enumerate(out)]
    kept = [torch.allclose(o, x[i], atol=1e-5) for i, o in enumerate(out)]
    assert all(m != k for m, k in zip(mirrored, kept)) and 0 < sum(mirrored) < 16
    bright = encoder_of(build([image_input({"brightness": 0.5}, channels=3,
                                           normalize="imagenet")]), "photo").augment
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    raw = torch.rand(16, 3, 16, 12) * 0.9 + 0.1  # pixels / 255, none black
    ratio = (bright((raw - mean) / std) * std + mean) / raw
    factors = ratio.flatten(1)  # one brightness factor per image, on the raw pixels
    assert torch.allclose(factors, factors[:, :1].expand_as(factors), atol=1e-4)
    assert ((factors[:, 0] >= 0.5) & (factors[:, 0] <= 1.5)).all()
    assert factors[:, 0].std() > 0


def resnet_input(channels=3):
    return fitted("photo", "image", channels * 16 * 16, height=16, width=16, channels=channels)


def saved_resnet(path, depth=18, wrap="state_dict"):
    torch.manual_seed(6)
    state = ResNetBody(depth, in_channels=3).state_dict()
    state["fc.weight"], state["fc.bias"] = torch.randn(10, 512), torch.randn(10)
    torch.save({wrap: state} if wrap else state, path)
    return state


def resnet_body(network):
    return encoder_of(network, "photo").layers[0]


def test_resnet_weights_load_from_a_file(tmp_path):
    path = tmp_path / "resnet18.pt"
    state = saved_resnet(path)
    encoders = {"photo": {"kind": "resnet18", "weights": str(path)}}
    trained = build([resnet_input()], load_weights=True, encoders=encoders)
    for key, value in resnet_body(trained).state_dict().items():
        assert torch.equal(value, state[key]), key
    path.unlink()  # a served model is rebuilt without the file, then takes its own weights
    served = build([resnet_input()], encoders=encoders)
    assert not torch.equal(resnet_body(served).conv1.weight, state["conv1.weight"])
    served.load_state_dict(trained.state_dict())
    x = torch.randn(2, 3 * 16 * 16)
    with torch.no_grad():
        torch.testing.assert_close(served.eval()(x), trained.eval()(x))
    saved_resnet(path)
    grey = resnet_body(build([resnet_input(channels=1)], load_weights=True, encoders=encoders))
    assert torch.allclose(grey.conv1.weight, state["conv1.weight"].sum(1, keepdim=True))


def test_wrong_weights_files_are_model_errors(tmp_path):
    def load(path):
        build([resnet_input()], load_weights=True,
              encoders={"photo": {"kind": "resnet18", "weights": str(path)}})

    with pytest.raises(ModelError, match=r"model\.encoders\.photo: no weights file at '.*nope"):
        load(tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_text("not a state dict")
    with pytest.raises(ModelError, match=r"model\.encoders\.photo: cannot read .*junk\.pt"):
        load(tmp_path / "junk.pt")
    saved_resnet(tmp_path / "deeper.pt", depth=34, wrap=None)
    with pytest.raises(ModelError, match=r"deeper\.pt' do not fit a ResNet-18.*unexpected: "
                                         r"layer1\.2\.conv1\.weight"):
        load(tmp_path / "deeper.pt")


def test_freeze_keeps_loaded_weights_through_training(tmp_path):
    path = tmp_path / "resnet18.pth"
    state = saved_resnet(path, wrap="model")
    network = build([fitted("n", "numeric", 1), resnet_input()], load_weights=True,
                    encoders={"photo": {"kind": "resnet18", "weights": str(path),
                                        "freeze": True}})
    head = network.head[0].weight.detach().clone()
    optimizer = torch.optim.AdamW(network.parameters(), lr=0.1)
    x = torch.randn(4, 1 + 3 * 16 * 16)
    network(x).square().mean().backward()
    optimizer.step()
    body = resnet_body(network)
    assert body.training  # batch norm keeps training mode (see resnet.freeze)
    for key, value in body.named_parameters():
        assert torch.equal(value, state[key]), key
    assert not torch.equal(network.head[0].weight, head)


def test_sequence_layers_in_a_plain_layer_list_train():
    torch.manual_seed(7)
    layers = [{"reshape": {"shape": [8, 1]}}, {"lstm": {"hidden": 6}},
              {"global_pool": {"op": "last"}}, {"linear": {"out": 1}}]
    network = build_network(model(layers), 8, 1)
    assert isinstance(network, torch.nn.Sequential)
    numeric = build_network(model(layers), 8, 1, [fitted(f"x{i}", "numeric", 1)
                                                   for i in range(8)])
    assert isinstance(numeric, torch.nn.Sequential)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    optimizer = torch.optim.Adam(network.parameters(), lr=0.05)
    before = torch.nn.functional.mse_loss(network(x), y).item()
    for _ in range(20):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(network(x), y)
        loss.backward()
        optimizer.step()
    assert loss.item() < before


def test_located_errors():
    with pytest.raises(ModelError, match=r"model\.layers\.0: embedding needs 'vocabulary'"):
        build_network(model([{"embedding": {"dim": 4}}, "flatten", {"linear": {"out": 1}}]),
                      5, 1)
    with pytest.raises(ModelError, match=r"model\.encoders\.text\.layers\.0: embedding: "
                                         r"vocabulary 5 is smaller than the feature's 30"):
        build([TEXT], encoders={"text": {"kind": "layers", "layers": [
            {"embedding": {"dim": 4, "vocabulary": 5}}, "flatten"]}})
    with pytest.raises(ModelError, match=r"model\.encoders\.text\.heads: .*3 heads do not "
                                         r"divide the width 8"):
        build([TEXT], encoders={"text": {"kind": "transformer", "dim": 8, "heads": 3}})
    with pytest.raises(ModelError, match=r"model\.encoders\.txt: no non-numeric feature"):
        build([TEXT], encoders={"txt": {"kind": "bag"}})
    with pytest.raises(ModelError, match=r"model\.layers\.0: reshape .*combined features "
                                         r"have 64 values"):
        build([TEXT], layers=[{"reshape": {"shape": [3, 3]}}])
    with pytest.raises(ModelError, match="the fitted inputs take 10 matrix columns, the data "
                                         "has 11"):
        build_network(model(), 11, 2, [TEXT])


def test_a_gru_learns_word_order():
    """Label: does token 1 come before token 2? Order-blind encoders cannot tell."""
    generator = torch.Generator().manual_seed(8)
    rows, labels = [], []
    for _ in range(256):
        length = int(torch.randint(2, 9, (1,), generator=generator))
        row = (torch.randint(3, 8, (length,), generator=generator)).tolist()
        first, second = torch.randperm(length, generator=generator)[:2].tolist()
        row[first], row[second] = 1, 2
        rows.append(row)
        labels.append(int(first < second))
    x, y = texts(rows, 8), torch.tensor(labels)
    torch.manual_seed(8)
    network = build([fitted("words", "sequence", 8, indices=8, values="tokens", max_length=8)],
                    encoders={"words": {"kind": "gru", "dim": 8, "hidden": 16}})
    optimizer = torch.optim.Adam(network.parameters(), lr=0.02)
    for _ in range(200):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(network(x), y).backward()
        optimizer.step()
    network.eval()
    with torch.no_grad():
        accuracy = (network(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.9


def test_a_categorical_embedding_takes_the_direct_lookup_with_the_layers_values():
    # the direct lookup (embedding + dropout + flatten as one F.embedding) must give what the
    # layers give, and keep the state dict's one entry per weight
    inputs = [{"name": "x", "type": "numeric", "spec": {"name": "x", "type": "numeric"},
               "columns": ["x"]},
              {"name": "u", "type": "categorical", "columns": ["u"], "indices": 10,
               "spec": {"name": "u", "type": "categorical"}}]
    model = ModelSpec.model_validate({"encoders": {"u": {"kind": "embedding", "dim": 4}},
                                      "layers": [{"linear": {"out": 1}}]})
    network = build_network(model, 2, 1, inputs=inputs).eval()
    assert list(network.state_dict()) == ["encoders.0.layers.0.weight", "head.0.weight",
                                          "head.0.bias"]
    encoder = network.encoders[0]
    assert encoder._lookup is not None
    part = torch.tensor([[3.0], [0.0], [9.0]])
    direct = encoder(part)
    lookup, encoder._lookup = encoder._lookup, None
    try:
        through_layers = encoder(part)
    finally:
        encoder._lookup = lookup
    assert torch.equal(direct, through_layers)
    assert torch.equal(direct[1], torch.zeros(4))  # index 0, the unknown value: zeros


@pytest.mark.parametrize("change, message", [
    (lambda entry: entry["spec"].update(max_length=0),
     "the fitted input 'review' has an invalid feature spec"),
    (lambda entry: entry.update(type="categorical"),
     "the fitted input 'review' is a categorical with a text spec"),
    (lambda entry: entry["spec"].update(max_length=3),
     r"the fitted input 'review' takes 4 columns; its shape \(3,\) needs 3"),
])
def test_a_card_whose_inputs_disagree_with_their_specs_is_refused(change, message):
    # a model card edited by hand or written by another version: refused when built, not
    # scored with columns read as something else
    entry = {"name": "review", "type": "text", "columns": [f"review[{i}]" for i in range(4)],
             "indices": 12, "spec": {"name": "review", "type": "text", "max_length": 4}}
    change(entry)
    model = ModelSpec.model_validate({"layers": [{"linear": {"out": 1}}]})
    with pytest.raises(ModelError, match=message):
        build_network(model, 4, 1, inputs=[entry])
