"""The stop rule: after a sequence takes a token, whether it is finished, and why.

One function, outside the engine's step (as vLLM V1's `check_stop`), so that the rule reads in one place
and its order is explicit. The first that holds wins:

    1. a stop string completed by the new text       -> ("stop", the string)   (the text is cut at it)
    2. EOS, once `min_tokens` are out                 -> ("stop", None)
    3. one of `stop_token_ids`, once `min_tokens` out -> ("stop", the token id)
    4. the grammar is complete (structured outputs)   -> ("stop", None)
    5. `max_tokens` generated                         -> ("length", None)
    6. the context reached `max_model_len`            -> ("length", None)

Beam search does not use it: its hypotheses end by HF's rule (inference/beam_search.py).
"""

from __future__ import annotations

from inference.sequence import Sequence


def check_stop(
    seq: Sequence, token: int, stop_string: str | None, grammar_done: bool, max_model_len: int
) -> tuple[str, str | int | None] | None:
    """(finish reason, stop reason) if `seq`, which just took `token`, is finished; None if it goes on.

    `stop_string`: the stop string the new text completed (`Detokenizer.find_stop`), if any; `grammar_done`:
    whether the sequence's grammar is terminated (`StructuredOutputManager.is_terminated`)."""
    params = seq.request.params
    num_out = seq.num_output_tokens
    if stop_string is not None:
        return "stop", stop_string
    if num_out >= params.min_tokens and token == seq.request.eos_token_id:
        return "stop", None
    if num_out >= params.min_tokens and token in params.stop_token_ids:
        return "stop", token
    if grammar_done:
        return "stop", None
    if params.max_tokens is not None and num_out >= params.max_tokens:
        return "length", None
    if len(seq.token_ids) >= max_model_len:
        return "length", None
    return None
