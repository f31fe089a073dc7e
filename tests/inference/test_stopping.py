"""The stop rule, without a model: which condition ends a sequence, in which order, and `min_tokens`."""

from inference.sampling_params import SamplingParams
from inference.sequence import Request
from inference.stopping import check_stop

EOS = 2


def seq_after(outputs: list[int], max_model_len: int = 100, **params):
    """A sequence of a 3-token prompt that has generated `outputs` (the last is the token just taken)."""
    request = Request("r", None, [10, 11, 12], SamplingParams(**params), eos_token_id=EOS)
    seq = request.seqs[0]
    seq.token_ids.extend(outputs)
    return lambda stop_string=None, grammar_done=False: check_stop(
        seq, outputs[-1], stop_string, grammar_done, max_model_len)


def test_each_condition_and_its_reason():
    assert seq_after([5, 6])() is None
    assert seq_after([5, EOS])() == ("stop", None)
    assert seq_after([5, 7], stop_token_ids=[7])() == ("stop", 7)
    assert seq_after([5, 6], stop=["ab"])(stop_string="ab") == ("stop", "ab")
    assert seq_after([5, 6])(grammar_done=True) == ("stop", None)
    assert seq_after([5, 6], max_tokens=2)() == ("length", None)
    assert seq_after([5, 6], max_model_len=5)() == ("length", None)


def test_the_first_that_holds_wins():
    assert seq_after([5, EOS], max_tokens=2)() == ("stop", None)  # EOS on the last allowed token
    assert seq_after([5, 7], stop_token_ids=[7], max_tokens=2)(stop_string="x") == ("stop", "x")


def test_min_tokens_defers_eos_and_stop_ids_but_not_the_limits():
    assert seq_after([EOS], min_tokens=2, max_tokens=5)() is None
    assert seq_after([5, EOS], min_tokens=2, max_tokens=5)() == ("stop", None)
    assert seq_after([7], min_tokens=2, max_tokens=5, stop_token_ids=[7])() is None
    assert seq_after([5, EOS], min_tokens=2, max_tokens=2)() == ("stop", None)
    assert seq_after([5, 6, 7], min_tokens=3, max_tokens=5, max_model_len=6)() == ("length", None)
