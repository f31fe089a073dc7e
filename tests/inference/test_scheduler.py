"""The scheduler's own API, without a model: the seat rule, fork / finish through the scheduler, a step's
outcome, and its figures; `check_integrity()` after each move."""

from inference.block_manager import BlockManager
from inference.sampling_params import SamplingParams
from inference.scheduler import Scheduler
from inference.sequence import Request, SequenceStatus


def request(request_id: str, num_tokens: int, n: int = 1) -> Request:
    return Request(request_id, None, list(range(1, num_tokens + 1)), SamplingParams(n=n), eos_token_id=None)


def scheduler(max_num_seqs: int = 4) -> Scheduler:
    return Scheduler(BlockManager(num_blocks=16, block_size=8, enable_prefix_caching=True), max_num_seqs, 64)


def test_an_unforked_request_takes_n_seats_until_it_forks():
    r = request("r", 5, n=3)
    assert r.seqs[0].seats == 3
    r.forked = True
    assert r.seqs[0].seats == 1


def test_admission_counts_seats_and_figures_count_requests():
    s = scheduler(max_num_seqs=4)
    three, two = request("three", 12, n=3), request("two", 9, n=2)
    s.add(three.seqs[0])
    s.add(two.seqs[0])
    plan = s.schedule()
    assert [item.seq.request_id for item in plan.scheduled] == ["three"]  # 3 + 2 seats > 4
    assert [r.request_id for r in s.waiting_requests()] == ["two"]
    s.step_ran(plan)
    stats = s.stats()
    assert (stats["num_requests_running"], stats["num_requests_waiting"], stats["num_blocks_used"]) == (1, 1, 2)
    assert three.seqs[0].num_computed_tokens == 12 and three.seqs[0].num_cached_blocks == 1  # one full block
    s.check_integrity()


def test_fork_and_finish_go_through_the_scheduler():
    s = scheduler()
    r = request("r", 12, n=2)
    parent = r.seqs[0]
    s.add(parent)
    s.step_ran(s.schedule())
    child = r.new_sequence(1, list(parent.token_ids))
    s.fork(parent, child)
    assert child.status is SequenceStatus.RUNNING and s.running_sequences() == [parent, child]
    assert child.block_table == parent.block_table and s.view().ref_counts[parent.block_table[0]] == 2
    s.check_integrity()
    child.status = SequenceStatus.FINISHED
    s.finish(child)
    assert s.running_sequences() == [parent] and s.view().ref_counts[parent.block_table[0]] == 1
    s.check_integrity()
    parent.status = SequenceStatus.FINISHED
    s.finish(parent)
    assert s.stats()["num_blocks_used"] == 0 and not s.has_work()
    s.check_integrity()
