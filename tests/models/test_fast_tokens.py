"""Tests for vlarun/models/fast_tokens.py: the FAST action tokenizer (DCT + round + BPE)."""

import json
import math

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from vlarun.models.action_tokens import NormStats
from vlarun.models.fast_tokens import FastDecodeError, FastTokenizer, dct_matrix

T, D = 10, 7


def _smooth_chunks(n: int, seed: int = 0) -> list[np.ndarray]:
    """Normalised chunks that look like robot motion: a few slow sinusoids per dimension."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, T)[:, None]  # (T, 1)
    out = []
    for _ in range(n):
        amp, freq, phase = rng.uniform(0.1, 0.6, D), rng.uniform(0.2, 1.5, D), rng.uniform(0, 6, D)
        out.append(np.clip(amp * np.sin(2 * np.pi * freq * t + phase), -1, 1))
    return out


@pytest.fixture(scope="module")
def fitted() -> FastTokenizer:
    return FastTokenizer.fit(_smooth_chunks(300), scale=10.0, vocab_size=512)


def test_dct_matrix_matches_the_definition_and_is_orthonormal():
    n = 5
    x = np.random.default_rng(1).normal(size=n)
    by_definition = [
        (math.sqrt(1 / n) if k == 0 else math.sqrt(2 / n))
        * sum(x[t] * math.cos(math.pi * k * (2 * t + 1) / (2 * n)) for t in range(n))
        for k in range(n)
    ]
    c = dct_matrix(n)
    np.testing.assert_allclose(c @ x, by_definition, atol=1e-12)
    np.testing.assert_allclose(c @ c.T, np.eye(n), atol=1e-12)
    scipy_fft = pytest.importorskip("scipy.fft")
    np.testing.assert_allclose(c @ x, scipy_fft.dct(x, norm="ortho"), atol=1e-12)


def test_round_trip_is_the_rounded_dct_and_within_the_bound(fitted):
    # Decode must give exactly the inverse DCT of round(dct(x) * scale) / scale, and so err by
    # at most 0.5 * sqrt(T) / scale in any entry (and in L2 per dimension): C is orthonormal.
    bound = 0.5 * math.sqrt(T) / fitted.scale
    c = dct_matrix(T)
    for x in _smooth_chunks(20, seed=7):
        ids = fitted.encode(x)
        y = fitted.decode(ids)
        expected = c.T @ (np.rint(c @ x * fitted.scale) / fitted.scale)
        np.testing.assert_allclose(y, expected, atol=1e-12)
        assert np.linalg.norm(y - x, axis=0).max() <= bound
    assert fitted.clamped == 0


def test_frequency_major_order_and_min_token_offset(fitted):
    # The ids decode to the coefficients in C order of (frequency, dimension): the first D
    # characters are the D DC terms.
    x = _smooth_chunks(1, seed=3)[0]
    q = fitted.coefficients(x)
    text = fitted.bpe.decode(fitted.encode(x))
    assert [ord(ch) + fitted.min_token for ch in text[:D]] == q[0].tolist()
    assert [ord(ch) + fitted.min_token for ch in text] == q.reshape(-1).tolist()


def test_bpe_compresses_a_smooth_chunk(fitted):
    lengths = [len(fitted.encode(x)) for x in _smooth_chunks(20, seed=11)]
    assert max(lengths) < T * D / 2, lengths  # 70 integers -> fewer than 35 ids


def test_coefficients_below_min_token_are_clamped_as_the_reference(fitted):
    x = np.full((T, D), -1.0)
    x[:, 0] = -50.0  # far outside a normalised range: DC term far below min_token
    q = fitted.coefficients(x)
    assert q[0, 0] < fitted.min_token
    before = fitted.clamped
    back = fitted.decode_coefficients(fitted.encode(x))
    assert back[0, 0] == fitted.min_token
    assert fitted.clamped > before


def test_malformed_ids_raise(fitted):
    ids = fitted.encode(_smooth_chunks(1, seed=5)[0])
    with pytest.raises(FastDecodeError, match="coefficients"):
        fitted.decode(ids[:-1] if len(ids) > 1 else ids + ids)
    with pytest.raises(FastDecodeError, match="outside the FAST vocabulary"):
        fitted.decode([*ids, fitted.vocab_size])
    with pytest.raises(FastDecodeError, match="outside"):
        fitted.decode([-1])
    # A lone UTF-8 continuation byte (0x80 is the byte-level symbol U+0122 'Ģ').
    lone = fitted.bpe.token_to_id("\u0122")
    assert lone is not None
    with pytest.raises(FastDecodeError, match="UTF-8"):
        fitted.decode([lone])


def test_wrong_chunk_shape_and_bad_values_raise(fitted):
    with pytest.raises(ValueError, match="shape"):
        fitted.encode(np.zeros((T + 1, D)))
    with pytest.raises(ValueError, match="NaN"):
        fitted.encode(np.full((T, D), np.nan))


def test_save_load_round_trip(tmp_path, fitted):
    fitted.save(tmp_path)
    config = json.loads((tmp_path / "processor_config.json").read_text())
    assert config["min_token"] == fitted.min_token and config["scale"] == fitted.scale
    loaded = FastTokenizer.load(tmp_path)
    assert (loaded.action_horizon, loaded.action_dim) == (T, D)
    for x in _smooth_chunks(5, seed=9):
        ids = fitted.encode(x)
        assert loaded.encode(x) == ids
        np.testing.assert_array_equal(loaded.decode(ids), fitted.decode(ids))


def test_load_needs_the_chunk_shape_when_the_file_has_none(tmp_path, fitted):
    fitted.save(tmp_path)
    config = json.loads((tmp_path / "processor_config.json").read_text())
    config.update(time_horizon=None, action_dim=None)  # as the universal FAST+ file
    (tmp_path / "processor_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="action_horizon"):
        FastTokenizer.load(tmp_path)
    assert FastTokenizer.load(tmp_path, action_horizon=T, action_dim=D).action_dim == D
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        FastTokenizer.load(tmp_path / "nowhere")


def test_robot_units_round_trip_through_norm_stats(fitted):
    # The tokenizer sees normalised chunks only: NormStats does the normalisation.
    norm = NormStats(q01=[-0.2] * D, q99=[0.3] * D)
    x = _smooth_chunks(1, seed=13)[0]
    robot = norm.unnormalize(x)
    back = norm.unnormalize(fitted.decode(fitted.encode(norm.normalize(robot))))
    half_range = 0.25
    assert np.abs(back - robot).max() <= half_range * 0.5 * math.sqrt(T) / fitted.scale + 1e-6


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one"):
        FastTokenizer.fit([])
    with pytest.raises(ValueError, match="one shape"):
        FastTokenizer.fit([np.zeros((T, D)), np.zeros((T, D + 1))])
    with pytest.raises(ValueError, match="byte alphabet"):
        FastTokenizer.fit(_smooth_chunks(3), vocab_size=100)


def test_encode_refuses_a_vocabulary_that_would_drop_coefficients():
    # A byte-level BPE file that lacks most byte symbols: BPE would drop those characters
    # silently; encode must refuse instead of returning a short sequence.
    bpe = Tokenizer(models.BPE(vocab={"A": 0, "B": 1}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tok = FastTokenizer(bpe, action_horizon=T, action_dim=D, min_token=-65)
    assert tok.decode_coefficients([0] * (T * D)).max() == 0  # "A" is coefficient 0
    with pytest.raises(ValueError, match="does not give this chunk's coefficients back"):
        tok.encode(_smooth_chunks(1)[0])
