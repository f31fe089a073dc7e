"""Incremental detokenisation: token by token, the text equals a whole decode, and never shows half a character."""

from transformers import AutoTokenizer

from inference.detokenizer import Detokenizer
from inference.model_loader import DEFAULT_MODEL, resolve_model
from inference.sampling_params import SamplingParams
from inference.sequence import Request

TEXT = "Hi there! Emoji 🙂🎉, Korean 안녕하세요, code `def f(x): return x * 2`, and <|im_end|> done."


def stream(tokenizer, prompt: list[int], output: list[int], skip_special_tokens: bool) -> list[str]:
    params = SamplingParams(skip_special_tokens=skip_special_tokens)
    seq = Request("r", None, list(prompt), params, eos_token_id=None).seqs[0]
    detokenizer = Detokenizer(tokenizer)
    detokenizer.start(seq)
    pieces = []
    for token in output:
        seq.token_ids.append(token)
        pieces.append(detokenizer.update(seq))
    assert seq.output_text == "".join(pieces)
    return pieces


def test_token_by_token_text_equals_the_whole_decode_and_holds_back_split_characters():
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    prompt = tokenizer.encode("You are helpful.", add_special_tokens=False)
    output = tokenizer.encode(TEXT, add_special_tokens=False)
    for skip in (True, False):
        pieces = stream(tokenizer, prompt, output, skip)
        assert "".join(pieces) == tokenizer.decode(output, skip_special_tokens=skip)
        assert not any("\ufffd" in piece for piece in pieces)
    # An emoji spans several byte-level tokens: the ones before its last yield nothing, not a replacement char.
    assert "" in stream(tokenizer, prompt, output, True)
    assert "<|im_end|>" in "".join(stream(tokenizer, prompt, output, False))
