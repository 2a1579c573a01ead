"""Row regions (rowregion.py): where the target is not timed, an attention scores matmul joins
the region only when no tile is partial."""
from __future__ import annotations

import pytest

from packager.optimize.globalfuse.graph import kernel_graph


@pytest.mark.parametrize("tokens,taken", [(64, 1), (37, 0)])
def test_untimed_attention_regions_need_whole_tiles(tokens, taken):
    """Where the target is not timed, the scores matmul joins the region only when no tile is
    partial (ViT's 197 tokens measured 8x slower merged on x86)."""
    from types import SimpleNamespace

    from packager.optimize.globalfuse.rowregion import row_regions
    from support.kernel_cases import host_target, optimized_module, scheduler, scores_attention

    target = host_target()
    mod = optimized_module(scores_attention(tokens, tokens, 16), target, global_fusion=False)
    sched = scheduler(target)
    out, rows = row_regions(mod, SimpleNamespace(target=target, scheduler=sched), sched, None)
    assert rows.taken == 1 and rows.with_matmul == taken, rows
    assert len(kernel_graph(out).calls) == 2 - taken
    if not taken:
        assert any("predicated" in why for why in rows.refused.values()), rows.refused
