"""Passkey retrieval: prompt layout and length, the byte-level task batch, and exact match."""

from __future__ import annotations

import functools

import pytest
import torch

from posenc.lab.common.evaluate import exact_match
from posenc.lab.extend.needles import passkey as pk

NEEDLE = pk.NEEDLE.format(key=68203)
LONGEST_SENTENCE = max(len(s) for s in pk.FILLER.split(". ")) + 2  # a sentence with its ". "


@functools.cache
def _tokenizer():
    return byte_bpe_tokenizer()


def byte_bpe_tokenizer(folder=None):
    """A small byte-level BPE tokenizer trained here on the filler and some code (nothing downloaded)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [pk.FILLER, NEEDLE, pk.QUESTION, "def f(x):\n    return x * 2 + 1\n"] * 20
    tok.train_from_iterator(text, trainer)
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    if folder is not None:
        fast.save_pretrained(folder)
    return fast


def _filler_around(text: str) -> tuple[int, int]:
    """Characters of filler before the needle and in all (the joining spaces counted with the filler)."""
    body = text[: -len("\n" + pk.QUESTION)]
    return body.index(NEEDLE), len(body) - len(NEEDLE)


@pytest.mark.parametrize("chars", [pk.MIN_CHARS, pk.MIN_CHARS + 1, pk.MIN_CHARS + 7, 160, 257, 1000, 4099])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_prompt_has_the_exact_length_and_the_needle_at_the_depth(chars, depth):
    text = pk.passkey_text(chars, depth, 68203)
    assert len(text) == chars and len(text.encode()) == chars
    assert text.endswith("\n" + pk.QUESTION)
    assert text.count("68203") == 2 and text.count(NEEDLE) == 1
    before, filler = _filler_around(text)
    assert abs(before - depth * filler) <= LONGEST_SENTENCE, (before, filler)
    if depth == 0.0:
        assert text.startswith(NEEDLE)
    if depth == 1.0:
        assert text.endswith(NEEDLE + "\n" + pk.QUESTION)
    if filler > 2 * LONGEST_SENTENCE:
        assert "There and back again." in text
        if not text.endswith(NEEDLE + "\n" + pk.QUESTION):  # whole sentences close the filler before the question
            assert text.endswith("There and back again.\n" + pk.QUESTION)


def test_prompt_is_the_filler_needle_and_question_in_order():
    text = pk.passkey_text(300, 0.5, 12345)
    assert "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again." in text
    assert "The pass key is 12345. Remember it. 12345 is the pass key." in text
    assert text.endswith("What is the pass key? The pass key is")


def test_prompt_rejects_bad_input():
    with pytest.raises(ValueError, match="length=95"):
        pk.passkey_text(pk.MIN_CHARS - 1, 0.5, 12345)
    with pytest.raises(ValueError, match="depth=1.5"):
        pk.passkey_text(200, 1.5, 12345)
    with pytest.raises(ValueError, match="key=123"):
        pk.passkey_text(200, 0.5, 123)


@pytest.mark.parametrize("length", [60, 64, 100, 257])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_prompt_fits_a_token_length_within_one_token(length, depth):
    tokenizer = _tokenizer()
    text = pk.passkey_prompt(length, depth, 54321, tokenizer)
    n = len(tokenizer(text)["input_ids"])
    assert length - 1 <= n <= length
    assert text.endswith(pk.QUESTION) and pk.NEEDLE.format(key=54321) in text
    longer = pk.passkey_text(len(text) + 1, depth, 54321)  # one more character no longer fits
    assert len(tokenizer(longer)["input_ids"]) > length


def test_prompt_too_short_for_the_tokenizer_is_an_error():
    tokenizer = _tokenizer()
    with pytest.raises(ValueError, match="length=5 is invalid"):
        pk.passkey_prompt(5, 0.5, 54321, tokenizer)
    assert pk.min_length(tokenizer) > 5 and pk.min_length() == pk.MIN_CHARS


def test_passkey_batch_shapes_mask_and_layout():
    length = 150
    x, y, mask = pk.passkey_batch(4, length, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == mask.shape == (4, length)
    assert x.dtype == y.dtype == torch.int64 and mask.dtype == torch.bool
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    expected_mask = torch.zeros(4, length, dtype=torch.bool)
    expected_mask[:, -5:] = True
    torch.testing.assert_close(mask, expected_mask)
    for i in range(4):
        seq = bytes(x[i].tolist() + [int(y[i, -1])]).decode()
        prompt, answer = seq[: -pk.DIGITS - 1], seq[-pk.DIGITS :]
        assert prompt.endswith(pk.QUESTION) and seq[-pk.DIGITS - 1] == " "
        assert pk.NEEDLE.format(key=answer) in prompt  # the scored digits are the hidden key
        assert bytes(y[i][mask[i]].tolist()).decode() == answer


def test_passkey_batch_is_deterministic_and_varies_depth_and_key():
    a = pk.passkey_batch(16, 200, generator=torch.Generator().manual_seed(3))
    b = pk.passkey_batch(16, 200, generator=torch.Generator().manual_seed(3))
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v)
    keys = {bytes(row[-5:].tolist()) for row in a[1]}
    positions = {bytes(row.tolist()).find(b"The pass key is") for row in a[0]}
    assert len(keys) > 10 and len(positions) > 3  # random key and depth per row
    fixed = pk.passkey_batch(8, 200, generator=torch.Generator().manual_seed(3), depth=0.0)[0]
    assert all(bytes(row.tolist()).startswith(b"The pass key is") for row in fixed)


def test_passkey_batch_rejects_bad_input():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="length=100"):
        pk.passkey_batch(2, 100, generator=g)
    with pytest.raises(ValueError, match="generator"):
        pk.passkey_batch(2, 200, generator=0)
    with pytest.raises(ValueError, match="depth=-0.1"):
        pk.passkey_batch(2, 200, generator=g, depth=-0.1)


def test_exact_match_on_hand_made_logits_scores_only_the_digits():
    x, y, mask = pk.passkey_batch(3, 120, generator=torch.Generator().manual_seed(1))
    logits = torch.nn.functional.one_hot(y, 256).float()  # (3, 120, 256): argmax is the truth everywhere
    assert exact_match(logits, y, mask) == 1.0
    wrong_filler = logits.clone()
    wrong_filler[:, 0] = torch.nn.functional.one_hot(torch.full((3,), 7), 256).float()  # not scored
    assert exact_match(wrong_filler, y, mask) == 1.0
    one_digit = logits.clone()
    one_digit[1, -3] = torch.nn.functional.one_hot(torch.tensor((int(y[1, -3]) - 48 + 1) % 10 + 48), 256).float()
    assert exact_match(one_digit, y, mask) == pytest.approx(2 / 3)


def _copying_model(tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``(B, S, 256)`` of a hand-made model: after the question it copies the needle's key when the key is
    even and says "0" when it is odd; elsewhere it predicts byte 0."""
    cue = b"The pass key is "
    out = torch.zeros(*tokens.shape, 256)
    for b in range(tokens.shape[0]):
        text = bytes(tokens[b].tolist())
        key_at, answer_at = text.find(cue) + len(cue), text.rfind(cue) + len(cue)
        for t in range(answer_at - 1, tokens.shape[1]):
            k = t - (answer_at - 1)  # the target of t is the answer's k-th digit
            if k < pk.DIGITS:
                even = text[key_at + pk.DIGITS - 1] % 2 == 0  # the key's last digit (ASCII parity = digit parity)
                out[b, t, text[key_at + k] if even else ord("0")] = 1.0
    return out


def test_teacher_forced_exact_match_equals_greedy_decoding():
    x, y, mask = pk.passkey_batch(16, 140, generator=torch.Generator().manual_seed(2))
    even = (y[:, -1] % 2 == 0).float().mean().item()
    assert 0 < even < 1
    teacher = exact_match(_copying_model(x), y, mask)
    right = 0
    for b in range(16):
        tokens = x[b : b + 1, : x.shape[1] - pk.DIGITS + 1]  # (1, S'): the prompt and its " ", no digit
        for _ in range(pk.DIGITS):  # greedy decoding
            tokens = torch.cat([tokens, _copying_model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
        right += torch.equal(tokens[0, -pk.DIGITS :], y[b, -pk.DIGITS :])
    assert teacher == right / 16 == even


def test_answer_matches_reads_the_first_number():
    assert pk.answer_matches(" 68203. Remember it.", 68203)
    assert not pk.answer_matches(" 6820", 68203) and not pk.answer_matches(" no idea", 68203)
    assert not pk.answer_matches(" 12 68203", 68203)
