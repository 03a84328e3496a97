"""The slow reads of a canary run off the pass: a hung one holds a probe thread, not the pass."""

from __future__ import annotations

import threading

import pytest

from llmfleet.reconcile import Probes


@pytest.fixture
def probes():
    finished: list[str] = []
    done = threading.Condition()

    def mark(uid: str) -> None:
        with done:
            finished.append(uid)
            done.notify_all()

    probes = Probes(2, mark)
    probes.finished, probes.done = finished, done
    yield probes
    probes.stop()


def wait_finished(probes, uid: str) -> None:
    with probes.done:
        assert probes.done.wait_for(lambda: uid in probes.finished, timeout=10), f"{uid}'s probe never finished"


def test_a_hung_probe_holds_no_pass_and_another_deployment_gets_its_answer(probes):
    hung = threading.Event()
    try:
        # The pass that starts a probe goes on without its answer.
        assert probes.answer("a", "golden", "q", lambda: hung.wait(60)) is None
        assert probes.answer("a", "golden", "q", lambda: "never asked") is None  # still running: not asked again
        assert probes.answer("b", "golden", "q", lambda: "b's answers") is None
        wait_finished(probes, "b")
        assert probes.answer("b", "golden", "q", lambda: "asked again") == "b's answers"
        assert "a" not in probes.finished
    finally:
        hung.set()
    wait_finished(probes, "a")
    assert probes.answer("a", "golden", "q", lambda: "asked again") is True  # what the hung probe returned


def test_an_answer_is_taken_once_and_only_for_its_own_question(probes):
    assert probes.answer("a", "analysis", ("v1", "v2", 1), lambda: "first evaluation") is None
    wait_finished(probes, "a")
    # The canary moved on: the old answer is dropped unread and the new question asked.
    assert probes.answer("a", "analysis", ("v1", "v3", 1), lambda: "v3's evaluation") is None
    probes.finished.clear()
    wait_finished(probes, "a")
    assert probes.answer("a", "analysis", ("v1", "v3", 1), lambda: "unused") == "v3's evaluation"
    assert probes.answer("a", "analysis", ("v1", "v3", 1), lambda: "next evaluation") is None  # taken: asked anew


def test_a_probe_that_raised_raises_in_the_pass_that_reads_it(probes):
    def broken():
        raise RuntimeError("the gate's own bug")

    assert probes.answer("a", "golden", "q", broken) is None
    wait_finished(probes, "a")
    with pytest.raises(RuntimeError, match="the gate's own bug"):
        probes.answer("a", "golden", "q", broken)
