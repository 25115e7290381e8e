"""The public surface of the pure core, pinned: `sim.memory` and its rendering module."""

import ast
from pathlib import Path

from sim import memory
from sim.memory import render

ROOT = Path(memory.__file__).parent.parent.parent


def test_memory_exports_exactly_the_public_names() -> None:
    assert set(memory.__all__) == {
        "Belief", "CategoryReport", "Episode", "Fact", "Line", "NpcState", "OverBudgetError", "RENDERER_VERSION",
        "TOKENIZERS", "TruncationReport", "WorkingMemory", "WorkingMemoryConfig", "WorldFact", "build_working_memory",
        "inert", "belief_order", "episode_order", "fact_order", "line_order", "world_order", "render",
        "token_counter", "CategoryExplanation", "DROP_REASONS", "DropReason", "DroppedItem", "TruncationExplanation",
        "explain_truncation",
    }
    for name in memory.__all__:
        assert getattr(memory, name) is not None


def test_render_exports_exactly_the_prompt_format() -> None:
    assert set(render.__all__) == {
        "CATEGORY_HEADERS", "RENDER", "RENDERER_VERSION", "RENDER_ORDER", "RULE_HEADER", "TAIL_HEADER", "Escape",
        "RenderedState", "Section", "TokenSizes", "escape_for", "inert", "render_belief", "render_episode",
        "render_fact", "render_head", "render_line", "render_rule", "render_tail", "render_world", "rendered",
        "token_sizes",
    }
    for name in render.__all__:
        assert getattr(render, name) is not None
    assert memory.render is render and memory.inert is render.inert
    assert memory.RENDERER_VERSION == render.RENDERER_VERSION


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
    for path in [*core.glob("*.py"), core.parent / "checker.py"]:
        for module in _imported_modules(ast.parse(path.read_text())):
            assert not module.startswith(("sim.store", "sim.bus", "sim.inference", "sim.runner", "sim.cli",
                                          "agents", "aiomqtt", "aiosqlite", "httpx")), (path, module)


def test_state_types_import_nothing_of_the_rendering() -> None:
    """The data model stands alone: nothing of sim.memory (rendering, builder) is imported by it."""
    state = Path(memory.__file__).parent / "_state.py"
    imported = _imported_modules(ast.parse(state.read_text()))
    assert imported and not [m for m in imported if m.startswith(memory.__name__)], imported


def test_no_module_outside_the_core_imports_its_private_modules() -> None:
    core = Path(memory.__file__).parent
    private = f"{memory.__name__}._"
    outside = [p for top in ("sim", "agents", "benchmarks", "tests") for p in (ROOT / top).rglob("*.py")
               if core not in p.parents]
    assert len(outside) > 50  # the walk found the code base
    for path in outside:
        for module in _imported_modules(ast.parse(path.read_text())):
            assert not module.startswith(private), (path.relative_to(ROOT), module)
