"""IncrementalDetokenizer: equals a full decode, handles split multi-byte characters, unknown ids,
stop strings across token boundaries, and never streams text a stop string will cut."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.engine.detokenizer import PROMPT_CONTEXT_TOKENS, IncrementalDetokenizer

WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "stop",
    "token", "model", "engine", "cache", "page", "batch",
    "你好", "世界", "中文", "模型", "推理", "引擎", "缓存", "分页",
    "😀", "🚀", "🎉", "👍🏽", "ça", "naïve", "Ωmega", "Привет",
]  # fmt: skip
# characters that are NOT in the training corpus: they fall back to several byte tokens
RARE = ["🦀", "🧬", "龘", "𝔘", "∮", "ǅ", "😀🦀", "你🧬好"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _corpus(seed: int = 0, lines: int = 300) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(3, 12)
        out.append(
            " ".join(rng.choice(WORDS) for _ in range(n)) + rng.choice([".", "!", "?\n", ",", "\n", ""])
        )
    return out


@pytest.fixture(scope="session")
def tokenizer():
    """A byte-level BPE (Qwen-style: ByteLevel pre-tokenizer and decoder) trained on ~15 KB of
    ASCII / CJK / emoji text, wrapped in PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = _corpus()
    assert 5_000 < sum(len(s.encode()) for s in corpus) < 40_000
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )


def _stream(detok: IncrementalDetokenizer, ids: list[int], chunks: list[int] | None = None) -> list[str]:
    """Feed ids one by one (or in the given chunk sizes); return the deltas, then finish()."""
    deltas = []
    i = 0
    sizes = chunks or [1] * len(ids)
    for n in sizes:
        deltas.append(detok.step(ids[i : i + n]))
        i += n
    if i < len(ids):
        deltas.append(detok.step(ids[i:]))
    deltas.append(detok.finish())
    return deltas


text_pieces = st.lists(st.sampled_from(WORDS + RARE + [" ", "\n", ".", ", "]), min_size=1, max_size=30)


# ------------------------------------------------------------------ equality with a full decode


def test_fixture_splits_multibyte_characters(tokenizer):
    """The test tokenizer really splits characters over tokens (otherwise the tests below are weak)."""
    for s in ["🦀", "🧬", "龘"]:
        ids = tokenizer.encode(s)
        assert len(ids) > 1
        assert any("\ufffd" in tokenizer.decode([i]) for i in ids)


@SETTINGS
@given(pieces=text_pieces, data=st.data())
def test_incremental_equals_full_decode_on_text(tokenizer, pieces, data):
    text = "".join(pieces)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    chunks = data.draw(st.lists(st.integers(1, 4), max_size=len(ids)))
    prompt = tokenizer.encode(data.draw(st.sampled_from(["", "hi 你好 🚀", "the 🦀"])))
    d = IncrementalDetokenizer(tokenizer, prompt)
    deltas = _stream(d, ids, chunks)
    assert "".join(deltas) == d.output_text == text
    # valid text never streams a half character
    assert all("\ufffd" not in x for x in deltas)
    assert d.stop_reason is None and not d.finished_by_stop


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), skip=st.booleans())
def test_incremental_equals_full_decode_on_random_ids(tokenizer, seed, skip):
    """Arbitrary id sequences (invalid UTF-8, special tokens included) still match decode()."""
    rng = random.Random(seed)
    ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 60))]
    d = IncrementalDetokenizer(tokenizer, tokenizer.encode("prompt 中文"), skip_special_tokens=skip)
    deltas = _stream(d, ids)
    expected = tokenizer.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == d.output_text == expected


def test_special_tokens_kept_or_skipped(tokenizer):
    ids = tokenizer.encode("hello<|im_end|> world<|endoftext|>")
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in ids
    for skip in (True, False):
        d = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip)
        assert "".join(_stream(d, ids)) == tokenizer.decode(ids, skip_special_tokens=skip)
    assert IncrementalDetokenizer(tokenizer, [], skip_special_tokens=True).step(ids[:2]) == "hello"


def test_multibyte_character_is_held_until_complete(tokenizer):
    ids = tokenizer.encode("ab🦀")
    d = IncrementalDetokenizer(tokenizer, [])
    deltas = [d.step([i]) for i in ids]
    assert "".join(deltas) == "ab🦀"
    assert deltas[-1].endswith("🦀") and all("\ufffd" not in x for x in deltas)
    # a request cut in the middle of a character flushes the replacement char like decode() does
    d = IncrementalDetokenizer(tokenizer, [])
    partial = ids[:-1]
    assert "".join(_stream(d, partial)) == tokenizer.decode(partial)
    assert tokenizer.decode(partial).endswith("\ufffd")


def test_window_is_small_no_full_redecode(tokenizer, monkeypatch):
    """Each step decodes a few trailing tokens, never the whole sequence."""
    text = " ".join(_corpus(seed=3, lines=20)) + " 🦀🧬龘"
    ids = tokenizer.encode(text)
    assert len(ids) > 150
    sizes = []
    orig = tokenizer.convert_tokens_to_string
    monkeypatch.setattr(
        tokenizer, "convert_tokens_to_string", lambda toks: sizes.append(len(toks)) or orig(toks)
    )
    d = IncrementalDetokenizer(tokenizer, tokenizer.encode("some prompt text that is long enough"))
    assert "".join(_stream(d, ids)) == text
    assert max(sizes) <= PROMPT_CONTEXT_TOKENS + 8


# ------------------------------------------------------------------ unknown ids


def test_unknown_ids_decode_to_nothing(tokenizer):
    V = len(tokenizer)
    d = IncrementalDetokenizer(tokenizer, [V + 3, 7])
    assert d.step([V]) == "" and d.step([V + 1000, 2**40]) == "" and d.output_text == ""
    ids = tokenizer.encode("hello 你好 🦀")
    mixed = []
    for i in ids:
        mixed += [i, V + 5]
    d = IncrementalDetokenizer(tokenizer, [])
    assert "".join(_stream(d, mixed)) == "hello 你好 🦀"
    assert d.num_output_ids == len(mixed)


# ------------------------------------------------------------------ stop strings


def _tokens_of(tokenizer, text):
    ids = tokenizer.encode(text)
    return ids, [tokenizer.decode([i]) for i in ids]


def test_stop_string_spanning_two_tokens(tokenizer):
    ids, pieces = _tokens_of(tokenizer, "hello world and more text")
    assert pieces[:2] == ["hello", " world"]  # so "lo wo" spans the first two tokens
    for include, expected in ((False, "hel"), (True, "hello wo")):
        d = IncrementalDetokenizer(tokenizer, [], stop=["lo wo"], include_stop_str_in_output=include)
        deltas = [d.step([i]) for i in ids]
        assert d.finished_by_stop and d.stop_reason == "lo wo"
        assert d.output_text == expected == "".join(deltas)
        assert all(x == "" for x in deltas[2:])  # nothing after the stop
        assert d.finish() == "" and d.output_text == expected
        if not include:
            assert all("lo wo" not in x for x in deltas)


def test_partial_stop_is_held_back_then_released(tokenizer):
    ids, pieces = _tokens_of(tokenizer, "hello world hello there")
    d = IncrementalDetokenizer(tokenizer, [], stop=["o wox", "zz"])
    deltas = [d.step([i]) for i in ids]
    assert deltas[0] == "hell"  # "o" might start "o wox": held back
    assert deltas[1] == "o world"  # " world" rules it out: released
    assert not d.finished_by_stop
    assert "".join(deltas) + d.finish() == d.output_text == "hello world hello there"


def test_earliest_stop_wins_and_flush_on_finish(tokenizer):
    ids, _ = _tokens_of(tokenizer, "the quick brown fox jumps")
    d = IncrementalDetokenizer(tokenizer, [], stop=["fox", "quick brown"])
    out = "".join(d.step([i]) for i in ids)
    assert d.stop_reason == "quick brown" and out == d.output_text == "the "
    # the request ends (max_tokens) while "jum" may still start a stop: finish() flushes it
    ids, _ = _tokens_of(tokenizer, "the lazy dog jum")
    d = IncrementalDetokenizer(tokenizer, [], stop="jumps")
    out = "".join(d.step([i]) for i in ids)
    assert out == "the lazy dog " and d.output_text == "the lazy dog jum"
    assert out + d.finish() == "the lazy dog jum"


def test_stop_strings_ignored_before_min_tokens(tokenizer):
    ids, pieces = _tokens_of(tokenizer, "stop the dog stop now")
    d = IncrementalDetokenizer(tokenizer, [], stop=["stop"], min_tokens=2)
    out = "".join(d.step([i]) for i in ids)
    assert d.finished_by_stop and out == d.output_text == "stop the dog "


@SETTINGS
@given(pieces=text_pieces, data=st.data())
def test_stop_strings_property(tokenizer, pieces, data):
    """Random text, a stop string taken from it: output = text before (or through) its first
    occurrence; deltas concatenate to output_text and never contain the stop string."""
    text = "".join(pieces)
    ids = tokenizer.encode(text)
    start = data.draw(st.integers(0, len(text) - 1))
    stop = text[start : start + data.draw(st.integers(1, 6))]
    include = data.draw(st.booleans())
    d = IncrementalDetokenizer(tokenizer, [], stop=[stop], include_stop_str_in_output=include)
    deltas = _stream(d, ids, data.draw(st.lists(st.integers(1, 3), max_size=len(ids))))
    first = text.find(stop)
    expected = text[: first + len(stop)] if include else text[:first]
    assert d.finished_by_stop and d.stop_reason == stop
    assert "".join(deltas) == d.output_text == expected
    if not include:
        assert stop not in "".join(deltas)
