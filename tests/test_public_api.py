"""The public surface, pinned in one place: every package's `__all__`, and the modules whose
names are a format or a contract (the prompt's rendering, the audit record, the trace).

A package's public names are its `__all__`, written out below: adding, removing or renaming
one is a change of the surface, made here on purpose. Every public module (no leading
underscore anywhere in its dotted name) has an `__all__`, and no `__all__` lists a private
name. The pure core's import rules close the file.
"""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

from sim import memory
from tests.helpers import REPO

TOPS = ("sim", "agents")

PACKAGES: dict[str, set[str]] = {
    "agents": set(),
    "sim": {"__version__"},
    "sim.bus": {
        "Bus", "BusConfig", "BusEvent", "BusStats", "Connected", "Mailbox", "open_bus",
    },
    "sim.checkers": {"Violation", "check_proposals", "check_working_memory"},
    "sim.cli": {"build_parser", "console", "main"},
    "sim.inference": {
        "BACKENDS", "Backend", "GENERIC_LINES", "InferenceRequest", "InferenceResult", "Pool",
        "PoolConfig", "PoolStatistics", "Priority", "RemoteWorker", "Reply", "WorkerConfig",
        "check_context_window", "check_reply_room", "decode_request", "decode_result",
        "encode_request", "encode_result", "fallback_line", "open_backend", "open_pool", "reply_problem",
        "open_tokenizer", "Tokenizer", "counted_memory", "KeptCounts",
    },
    "sim.inference.backends": {
        "BACKENDS", "Backend", "Limited", "PROMPT_FORMS", "PROMPT_PREFIXES", "Reply", "check_context_window",
        "check_reply_room", "convert_options", "open_backend", "open_tokenizer", "served_now", "Tokenizer",
        "Tokenizing",
    },
    "sim.loadtest": {
        "BudgetResult", "Builder", "CATEGORIES", "CategoryTruncation", "Checker", "KNEE_GAIN", "LatencyFigures",
        "LoadTestConfig", "LoadTestResult", "OUTPUTS", "PATHOLOGICAL_SHARE", "PROFILES", "Progress", "SweepPoint",
        "TimelinePoint", "TruncationFigures", "TruncationTally", "ViolationRecord", "agent_id", "default_processes",
        "generate_state", "knee_concurrency", "profile_of", "progress_view", "require_matplotlib",
        "result_sections", "run_loadtest", "write_plot", "Cell", "Section",
    },
    "sim.memory": {
        "Belief", "CategoryReport", "Episode", "Fact", "Line", "NpcState", "OverBudgetError", "RENDERER_VERSION",
        "TOKENIZERS", "TruncationReport", "WorkingMemory", "WorkingMemoryConfig", "WorldFact", "belief_order",
        "build_working_memory", "episode_order", "fact_order", "inert", "line_order", "render", "token_counter",
        "world_order", "CategoryExplanation", "DROP_REASONS", "DropReason", "DroppedItem", "TruncationExplanation",
        "explain_truncation", "QUOTE_MARKS", "own_words", "quoted", "SELECTIONS", "Selection", "ranking",
        "Distinct", "distinct", "leave_out_event", "TOKENIZER_FORMS", "TokenCounter", "CountsMissing",
        "PrefixReuse", "prefix_reuse", "ScoredSelection", "counted_by_server", "FOLD_EVENTS", "KEEP_SIGNIFICANCE",
        "MAX_KEPT", "MAX_SUMMARIES", "kept_rank", "recall", "strength", "hot_and_kept",
        "recalled_for", "summary_of", "with_recalled",
    },
    "sim.mqtt": {
        "Backoff", "BrokerAddress", "ClientOptions", "ENV_PASSWORD", "ENV_USERNAME", "LastWill", "Link", "LocalBroker",
        "MqttTransport", "ReconnectPolicy", "TlsFiles", "Transport", "open_client", "redact", "stay_connected",
        "topic_matches",
    },
    "sim.output": {
        "Arg", "ArgSpec", "ArgType", "BELIEFS_PER_SUBJECT", "CODES", "FORBIDDEN_RULE", "MAX_ARG_CHARS",
        "MAX_LINE_CHARS", "MAX_PROPOSAL_CHARS", "RESERVED_NAMES", "SCHEMA_RULE", "FactGuard", "Judged",
        "OutputPolicy", "ProposalVerdict", "RawReply", "Rules", "Verdict", "accepted", "allow_list_problem",
        "belief_of", "clean_line", "clean_text", "contradicted_fact", "forbidden_phrase", "gate_difference",
        "gate_proposals", "intent_schemas", "judge_attempts", "judge_reply", "known_names", "load_fact_guard",
        "longest_reply", "memory_of", "read_reply", "reply_schema", "reply_tokens", "record_rules", "rejected",
        "said_proposals", "say_part", "walked_to", "WorldValues",
    },
    "sim.protocol": set(),  # its public modules are the surface (sim.protocol.router, ...)
    "sim.replay": {
        "CATEGORIES", "Change", "Comparison", "Divergence", "Executed", "Flip", "ForkReport", "MAX_VARIANTS",
        "Override", "POLICY_KEYS", "Plan", "Recording", "RunFigures", "MEMORY", "Span", "Tally", "Variant",
        "check_jobs", "compare",
        "default_jobs", "execute", "fork_report", "load_recording", "map_spans", "parse_overrides", "plan_spans",
        "records_of", "what_if", "write_plot",
    },
    "sim.shard": {
        "AGENT_KINDS", "Agent", "AgentContext", "BrokerConfig", "Claim", "Clock", "Connection", "InferenceConfig",
        "Limits", "MemoryConfigOf", "PLAYER_KINDS", "PausedCollector", "Placement", "Player", "RecordConfig",
        "RecordedInputs", "RunConfig", "RunStarted", "RunStats", "Seams", "Shard",
        "ShardContext", "ShardPlan", "StartupPhase", "StartupProgress", "SystemClock", "VirtualClock", "ambient_roll",
        "Moved", "Whereabouts", "assign_places", "create_agents", "hot_limit", "open_shard", "parse_shard", "run",
        "shard_npcs",
    },
    "sim.store": {
        "AuditSummary", "AuthorityError", "HOT_LIMIT", "Pending", "PlaceRows", "Resume",
        "RunIdentity", "RunSettings", "SCHEMA_VERSION", "SchemaError", "Store", "StoreError", "StoreReader",
        "StoreStatistics", "TickRecord", "Writer", "arrivals_path", "delete_audit_records", "new_store", "newest_store",
        "open_own", "open_reader", "open_store", "prune_stores", "read_arrivals", "Summaries", "Summary",
        "TamperError", "Verification", "kept_key", "kept_key_path", "read_kept_key",
    },
    "sim.view": {
        "DEFAULT_PLAYER", "ENV_PASSWORD", "TOKEN_HEADER", "DialogueLine", "LiveFeed", "LiveView", "RunModel",
        "StoreComparison", "StoredRun", "ViewSource", "ViewThread", "build_app", "open_view_server", "open_view_thread",
    },
    "sim.wire": set(),  # its public modules are the surface (sim.wire.events, ...)
}

# Public modules whose names are a format or a contract others build on.
MODULES: dict[str, set[str]] = {
    "sim.audit": {
        "Attempt", "AuditRecord", "GateCheck", "ReplayResult", "ReplayTally", "Response",
        "attempt_prompt", "decode_record", "encode_record", "encoding_sha256", "make_record", "prompt_sha256", "replay",
        "replay_records", "trace_of",
    },
    "sim.memory.render": {
        "CATEGORY_HEADERS",
        "LOG_HEADER", "RECALLED_HEADER", "RENDER", "RENDERER_VERSION", "RENDER_ORDER", "RULE_HEADER", "RenderedState",
        "Section", "TAIL_HEADER", "TokenSizes", "inert", "render_belief", "render_episode",
        "render_fact", "render_head", "render_line", "render_rule", "render_tail", "render_world", "rendered",
        "token_sizes",
    },
    "sim.metrics": {"Metrics", "MetricsSink", "NullMetrics", "RunCounts", "serve_metrics"},
    "sim.wire.channel": {"Bound", "Channel", "EntriesBound", "MessageBounds", "Role", "TextBound"},
    "sim.wire.contract": {
        "ASYNCAPI_VERSION", "CHANNELS", "GAME", "MARKDOWN_BEGIN", "MARKDOWN_END", "MQTT_BINDING_VERSION", "OWN_PLAYER",
        "PLAYER",
        "SERVER", "ChannelName", "Intents", "asyncapi", "channel_named", "channel_of", "encode_document", "markdown",
        "message_schema",
    },
    "sim.wire.trace": {
        "RosterEntry", "RosterMessage", "TRACE_DROPPED", "TraceAttempt", "TraceMessage", "decode_roster",
        "decode_traces", "encode_roster", "encode_trace", "for_trace", "Recalled",
    },
    "sim.wire.attempt": {
        "MAX_LINE_CHARS", "Arg", "ArgSpec", "ArgType", "Attempt", "OutputPolicy", "ProposalVerdict", "Rules",
        "ServedBy", "Usage", "WorldValues",
    },
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_names() -> dict[str, Path]:
    """Every module of sim and agents by dotted name (a package by its `__init__`)."""
    found = {}
    for top in TOPS:
        for path in sorted((REPO / top).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _declared_all(path: Path) -> list[str] | None:
    """The module's top-level `__all__` as written (a literal list), or None without one."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            names = ast.literal_eval(value)
            assert isinstance(names, list), f"{path.relative_to(REPO)}: __all__ is not a list"
            return names
    return None


def _exports_exactly(name: str, pinned: set[str]) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert len(exported) == len(set(exported)), f"{name}.__all__ names something twice"
    assert set(exported) == pinned, (
        f"{name}.__all__ changed: added {sorted(set(exported) - pinned)}, removed {sorted(pinned - set(exported))}"
    )
    for export in exported:
        assert not _private(export), f"{name}.__all__ exports the private name {export}"
        value = getattr(module, export)  # AttributeError: a name that does not resolve
        if isinstance(value, types.ModuleType):
            assert not any(_private(part) for part in value.__name__.split(".")), (
                f"{name}.__all__ exports the private module {value.__name__}"
            )


def test_every_package_exports_exactly_its_pinned_names() -> None:
    packages = sorted(n for n, path in _module_names().items() if path.name == "__init__.py")
    assert packages == sorted(PACKAGES), "a package was added or removed: pin its __all__ in PACKAGES"
    for name in packages:
        _exports_exactly(name, PACKAGES[name])


def test_the_modules_that_are_a_contract_export_exactly_their_pinned_names() -> None:
    for name, pinned in MODULES.items():
        _exports_exactly(name, pinned)
    assert memory.render is importlib.import_module("sim.memory.render")
    assert memory.inert is memory.render.inert and memory.RENDERER_VERSION == memory.render.RENDERER_VERSION


def test_every_public_module_has_an_all_and_no_all_names_a_private_name() -> None:
    modules = _module_names()
    assert len(modules) > 80  # the walk found the code base
    missing, leaks = [], []
    for name, path in modules.items():
        declared = _declared_all(path)
        if declared is None:
            if not any(_private(part) for part in name.split(".")):
                missing.append(name)
            continue
        leaks += [f"{name}: {export}" for export in declared if _private(export)]
    assert not missing, f"public modules without __all__: {missing}"
    assert not leaks, f"private names in __all__: {leaks}"


def _imported_modules(tree: ast.AST) -> list[str]:
    """Every module an `import` or `from ... import` names, those inside functions too."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_core_imports_no_io_layer() -> None:
    core = Path(memory.__file__).parent
    for path in [*core.glob("*.py"), *(core.parent / "checkers").glob("*.py")]:
        for module in _imported_modules(ast.parse(path.read_text())):
            assert not module.startswith(("sim.store", "sim.bus", "sim.inference", "sim.cli",
                                          "agents", "aiomqtt", "aiosqlite", "httpx")), (path, module)


def test_state_types_import_nothing_of_the_rendering() -> None:
    """The data model stands alone: nothing of sim.memory (rendering, builder) is imported by it."""
    state = Path(memory.__file__).parent / "_state.py"
    imported = _imported_modules(ast.parse(state.read_text()))
    assert imported and not [m for m in imported if m.startswith(memory.__name__)], imported


def test_no_module_outside_the_core_imports_its_private_modules() -> None:
    core = Path(memory.__file__).parent
    private = f"{memory.__name__}._"
    outside = [p for top in ("sim", "agents", "benchmarks", "tests") for p in (REPO / top).rglob("*.py")
               if core not in p.parents]
    assert len(outside) > 50  # the walk found the code base
    for path in outside:
        for module in _imported_modules(ast.parse(path.read_text())):
            assert not module.startswith(private), (path.relative_to(REPO), module)
