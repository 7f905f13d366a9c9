"""TensorFlow's healthy noise is folded from what `up` and `logs -f` show, and said once per task."""

from __future__ import annotations

from tfctl.tf.noise import NoiseFolder

START = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795723375.044602   11659 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
    "not be used.",
    "I0000 00:00:1795723375.392936   11659 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate "
    "compiler flags.",
    "E0000 00:00:1795723382.331516   11659 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed "
    "call to cuInit: UNKNOWN ERROR (303)",
    "WARNING:tensorflow:From /venv/lib/python3.11/site-packages/tensorflow/python/x.py:12: calling foo (from "
    "tensorflow.python.ops) with bar is deprecated and will be removed in a future version.",
    "Instructions for updating:",
    "Use baz instead.",
]
SERVER = "I0000 00:00:1795723382.425049   11659 grpc_server_lib.cc:467] Started server with target: grpc://localhost:1"


def test_start_up_noise_is_folded_and_said_once_before_the_first_line_worth_showing() -> None:
    folder = NoiseFolder()
    shown = folder.fold("worker:0", [*START, SERVER, "step 1"])
    assert shown == [
        "(tfctl folded 8 lines of TensorFlow's healthy start-up noise; `tfctl logs worker:0` shows every line)",
        SERVER,
        "step 1",
    ]
    cleanup = "I0000 00:00:1.1   7 local_rendezvous.cc:404] Local rendezvous is aborting with status: ABORTED: Cleanup"
    assert folder.fold("worker:0", [cleanup, "step 2"]) == ["step 2"]  # said once per task
    assert folder.folded["worker:0"] == 9
    assert folder.fold("worker:1", ["step 1"]) == ["step 1"]  # nothing folded: nothing said
    session = [
        "I0000 00:00:1795727885.114140    3385 mlir_graph_optimization_pass.cc:437] MLIR V1 optimization pass "
        "is not enabled",
        "I0000 00:00:1795727885.118806    3385 coordination_service.cc:221] Initializing CoordinationService",
    ]
    assert folder.fold("worker:0", [*session, "step 3"]) == ["step 3"]  # each new session's lines too


def test_what_is_news_is_never_folded() -> None:
    folder = NoiseFolder()
    news = [
        "F0000 00:00:1.1 7 cpu_feature_guard.cc:1] a fatal is never noise",
        "E0000 00:00:1.1 7 master.cc:1] CreateSession still waiting for response from worker: /job:ps/replica:0/task:0",
        "WARNING:tensorflow:From x.py:1: calling foo is deprecated",
        "step 3",  # a deprecation without instructions: what follows is news
        "Traceback (most recent call last):",
    ]
    shown = folder.fold("ps:0", news)
    assert shown == [news[0], news[1], folder.note("ps:0"), news[3], news[4]]
    assert folder.folded == {"ps:0": 1}
