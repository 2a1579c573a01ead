"""Layout decisions shared within a shape class (search.py, ConvSite.class_key): convs that
differ only in how many input channels they read (rounded up to a power of two) take the
layouts of the first one scored, in the same context; other convs are scored as before."""
from __future__ import annotations

from packager.optimize.layout.search import LayoutSearch
from packager.optimize.layout.sites import ConvSite
from packager.optimize.schedule.registry import scheduler_for
from packager.spec import OptimizeSpec

from test_propagate import X86


def _site(cin: int, groups: int = 1, cout: int = 64) -> ConvSite:
    return ConvSite((1, cin, 14, 14), (cout, cin // groups, 1, 1), (1, 1), (0,) * 4, (1, 1), groups, "float32")


class CountingSearch(LayoutSearch):
    """Real decisions over a fixed score (16-channel blocks fastest), counting what is scored."""

    def __init__(self, database):
        super().__init__(scheduler_for(X86, OptimizeSpec(database=database, measure=False)))
        self.scored: list[ConvSite] = []

    def _score(self, site, data_block, out_block):
        self.scored.append(site)
        return 1.0 if (data_block, out_block) == (16, 16) else 2.0


def test_a_dense_blocks_1x1_convs_are_scored_once_per_class(tmp_path):
    s = CountingSearch(tmp_path)
    decisions = [s.decide(_site(c), 16) for c in (160, 192, 224, 256, 288)]   # classes 256 and 512
    assert sorted({x.channels for x in s.scored}) == [160, 288]
    assert [bool(d.shared_from) for d in decisions] == [False, True, True, True, False]
    assert decisions[1].shared_from == "1x160x14x14*64x160x1x1"
    assert all((d.data_block, d.out_block, d.w_in) == (16, 16, 16) for d in decisions)


def test_another_context_or_a_grouped_conv_is_scored_again(tmp_path):
    s = CountingSearch(tmp_path)
    s.decide(_site(160), 16)
    d = s.decide(_site(192), 1)                      # another incoming block: another context
    assert not d.shared_from and 192 in {x.channels for x in s.scored}
    s.decide(_site(48, groups=48, cout=48), 16)      # depthwise convs: each its own class
    d = s.decide(_site(64, groups=64, cout=64), 16)
    assert not d.shared_from and {48, 64} <= {x.channels for x in s.scored if x.groups > 1}


def test_a_shared_decision_is_kept_in_the_database_under_its_own_key(tmp_path):
    first = CountingSearch(tmp_path)
    first.decide(_site(160), 16)
    first.decide(_site(192), 16)
    first.save()
    again = CountingSearch(tmp_path)
    d = again.decide(_site(192), 16)
    assert d.reused and d.shared_from and not again.scored


def test_an_fp16_conv_is_scored_with_the_accumulator_it_ships_with():
    """fp16 operands with an fp32 sum (optimize.precision): the candidates the search times sum
    in fp32 as the built kernel does, and a site keyed apart from an fp16-summing one (they were
    timed summing in fp16, and disagreed with each other by 15 fp16 steps)."""
    from tvm import relax

    from packager.optimize.schedule.measure.agree import rounds_through_half

    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float16"))
    w = relax.Var("w", relax.TensorType((32, 16, 3, 3), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        call = bb.normalize(relax.op.nn.conv2d(x, w, padding=1, out_dtype="float32"))
        bb.emit_func_output(call)
    site = ConvSite.of(call)
    assert (site.dtype, site.out_dtype) == ("float16", "float32")
    func = site.kernel(8, 8)
    assert str(func.params[-1].dtype) == "float32" and rounds_through_half(func)
    plain = ConvSite.of(bb.normalize(relax.op.nn.conv2d(x, w, padding=1)))
    assert plain.out_dtype == "" and plain.key() != site.key() and plain.class_key() != site.class_key()
    assert str(plain.kernel(8, 8).params[-1].dtype) == "float16"
