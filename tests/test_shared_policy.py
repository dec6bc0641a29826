"""nanocomposer/shared_policy.py: turns from many threads, generated together, each as it is alone."""

import threading

import pytest
from conftest import save_micro_checkpoint

from env.episode import TurnRequest
from nanocomposer.policy import ModelPolicy, SamplingConfig
from nanocomposer.shared_policy import SharedPolicy, SharedPolicyClosed

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOOLS = [{"type": "function", "function": {"name": "submit", "description": "Finish.",
                                           "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_micro_checkpoint(tmp_path_factory.mktemp("micro") / "sft", context=512)


def _requests(n: int) -> list[TurnRequest]:
    return [TurnRequest([{"role": "user", "content": f"task {i}: " + "fix the bug " * (1 + 7 * i)}], TOOLS,
                        f"session-{i}", i % 3) for i in range(n)]


def _tokens(results) -> list:
    return [r if isinstance(r, BaseException) else (r.completion_ids, [round(x, 4) for x in r.logprobs])
            for r in results]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_turns_from_many_threads_get_what_they_get_alone_and_share_decode_steps(checkpoint, temperature):
    sampling = SamplingConfig(max_new_tokens=24, temperature=temperature, seed=3)
    requests = _requests(6)
    alone_policy = ModelPolicy(checkpoint, sampling=sampling)
    alone = _tokens([alone_policy.act_batch([r])[0] for r in requests])
    shared = SharedPolicy(ModelPolicy(checkpoint, sampling=sampling), admit_every=2)
    got: dict[int, object] = {}
    start = threading.Barrier(len(requests))

    def session(i: int) -> None:
        start.wait()
        got[i] = shared.act_batch([requests[i]])[0]

    threads = [threading.Thread(target=session, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stats = shared.policy.generator.decode_stats
    shared.close()
    assert _tokens([got[i] for i in range(len(requests))]) == alone
    assert stats["row_steps"] > stats["steps"] > 0  # some decode steps served several sessions at once


def test_a_failing_request_fails_alone_and_close_answers_every_waiter(checkpoint):
    shared = SharedPolicy(ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=8)))
    too_long = TurnRequest([{"role": "user", "content": "word " * 2000}], TOOLS, "long", 0)
    fine = _requests(1)[0]
    results = shared.act_batch([too_long, fine])
    assert type(results[0]).__name__ == "ContextOverflow" and len(results[1].completion_ids) > 0
    shared.reset(None)
    assert shared.act(fine.messages, fine.tools).completion_ids  # the thread's own episode, act() protocol
    shared.close()
    with pytest.raises(SharedPolicyClosed):
        shared.act_batch([fine])


def test_a_policy_that_cannot_stream_is_served_in_rounds():
    class Rounds:
        name = "rounds"

        def __init__(self):
            self.calls = []
            self.entered, self.release = threading.Event(), threading.Event()

        def act_batch(self, requests):
            self.entered.set()
            self.release.wait(timeout=30)
            self.calls.append(len(requests))
            return [f"turn of {r.episode_key}" for r in requests]

    policy = Rounds()
    shared = SharedPolicy(policy)
    requests = _requests(5)
    got = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, shared.act_batch([requests[i]])[0]))
               for i in range(5)]
    threads[0].start()
    assert policy.entered.wait(timeout=30)  # the first request's round is in act_batch
    for t in threads[1:]:
        t.start()
    for _ in range(3000):  # the other four wait for the next round
        with shared._cond:
            if len(shared._waiting) == 4:
                break
        threading.Event().wait(0.01)
    policy.release.set()
    for t in threads:
        t.join(timeout=30)
    shared.close()
    assert got == {i: f"turn of session-{i}" for i in range(5)}
    assert policy.calls == [1, 4]


def test_the_server_shares_one_policy_per_version_and_closes_a_replaced_one(tmp_path, monkeypatch):
    """SessionManager: every worker's session of a checkpoint version gets the same SharedPolicy; after a
    promotion the old one is closed when its last session ends (or at the next load, if none was running)."""
    from nanocomposer.agent import manager as manager_module

    class Registry:
        current_version = "v0"

        def spec(self, version):
            return f"/checkpoints/{version}"

        def current(self):
            return self.current_version

    class Fake:
        def __init__(self, spec):
            self.name, self.closed = spec, False

        def act_batch(self, requests):
            return ["x"] * len(requests)

        def close(self):
            self.closed = True

    monkeypatch.setattr(manager_module.SessionManager, "_build", lambda self, spec: Fake(spec))
    registry = Registry()
    manager = manager_module.SessionManager(store=None, registry=registry)
    a, version_a = manager._policy({}, "v0")
    b, _ = manager._policy({}, "v0")
    assert a is b and version_a == "v0" and isinstance(a, SharedPolicy)
    registry.current_version = "v1"
    c, _ = manager._policy({}, "v1")
    assert c is not a and not a.policy.closed  # two v0 sessions still run
    manager._release("v0")
    assert not a.policy.closed
    manager._release("v0")
    assert a.policy.closed and "v0" not in manager._shared
    manager._release("v1")
    assert not c.policy.closed  # the current version stays loaded for the next session
    registry.current_version = "v2"
    d, _ = manager._policy({}, "v2")
    assert c.policy.closed and set(manager._shared) == {"v2"}  # v1 had no session left: closed at this load
    manager.stop()
    assert d.policy.closed


def test_a_generation_thread_that_dies_answers_every_caller_and_refuses_new_ones():
    """Whatever kills the generation thread, no session blocks forever on it."""

    class Dying:
        name = "dying"

        def open_stream(self):
            raise RuntimeError("no stream today")  # falls back to rounds

        def act_batch(self, requests):
            raise SystemExit("the policy pulled the plug")  # not an Exception: ends the thread

    shared = SharedPolicy(Dying())
    (result,) = shared.act_batch(_requests(1))
    assert isinstance(result, SharedPolicyClosed) and "SystemExit" in str(result)
    with pytest.raises(SharedPolicyClosed):
        shared.act_batch(_requests(1))
    shared.close()
