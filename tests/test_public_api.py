"""The public surface of the pure core, pinned."""

import sim.memory


def test_memory_exports_exactly_the_public_names() -> None:
    assert set(sim.memory.__all__) == {
        "Belief", "CategoryReport", "Episode", "Fact", "Line", "NpcState", "OverBudgetError", "RENDERER_VERSION",
        "TruncationReport", "WorkingMemory", "WorkingMemoryConfig", "WorldFact", "build_working_memory", "inert",
        "belief_order", "episode_order", "fact_order", "line_order", "world_order",
    }
    for name in sim.memory.__all__:
        assert getattr(sim.memory, name) is not None


def test_core_imports_no_io_layer() -> None:
    import ast
    from pathlib import Path

    core = Path(sim.memory.__file__).parent
    for path in [*core.glob("*.py"), core.parent / "checker.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("sim.store", "sim.bus", "sim.inference", "sim.runner", "sim.cli",
                                                   "agents", "aiomqtt", "aiosqlite", "httpx")), (path, node.module)
