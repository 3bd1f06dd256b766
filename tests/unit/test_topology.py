"""Layout: rank <-> coordinates, roles, named groups and their members, affected groups, layer split."""

from __future__ import annotations

import pytest

from tmslurm.core.errors import ConfigError
from tmslurm.core.topology import Coord, GroupSpec, Layout, split_layers


@pytest.mark.parametrize("dp, pp, tp", [(1, 1, 1), (2, 2, 1), (2, 3, 1), (3, 4, 1), (2, 2, 2)])
def test_rank_coord_round_trip(dp, pp, tp):
    layout = Layout(dp, pp, tp)
    seen = set()
    for rank in range(layout.world):
        c = layout.coord(rank)
        assert layout.rank(c.dp, c.stage, c.tp) == rank
        seen.add((c.dp, c.stage, c.tp))
    assert len(seen) == layout.world == dp * pp * tp


def test_rank_order_is_dp_major_then_stage():
    layout = Layout(2, 3)
    assert [layout.coord(r) for r in range(6)] == [
        Coord(0, 0),
        Coord(0, 1),
        Coord(0, 2),
        Coord(1, 0),
        Coord(1, 1),
        Coord(1, 2),
    ]


@pytest.mark.parametrize("bad", [-1, 4])
def test_coord_outside_the_layout_is_an_error(bad):
    with pytest.raises(ConfigError, match="valid: 0..3"):
        Layout(2, 2).coord(bad)


def test_rank_outside_the_layout_is_an_error():
    with pytest.raises(ConfigError, match="outside the layout"):
        Layout(2, 2).rank(2, 0)


@pytest.mark.parametrize("field", ["dp", "pp", "tp"])
def test_non_positive_degree_is_an_error(field):
    kwargs = {"dp": 1, "pp": 1, "tp": 1, field: 0}
    with pytest.raises(ConfigError, match=f"parallel.{field}=0"):
        Layout(**kwargs)


@pytest.mark.parametrize(
    "pp, stage_roles, roles",
    [
        (1, ["only"], ("only",)),
        (2, ["first", "last"], ("first", "last")),
        (3, ["first", "middle", "last"], ("first", "middle", "last")),
        (4, ["first", "middle", "middle", "last"], ("first", "middle", "last")),
    ],
)
def test_roles(pp, stage_roles, roles):
    layout = Layout(2, pp)
    assert [layout.role_of_stage(s) for s in range(pp)] == stage_roles
    assert [layout.role(r) for r in range(layout.world)] == stage_roles * 2
    assert layout.roles == roles
    for role in roles:
        assert layout.role_of_stage(layout.representative_stage(role)) == role


def test_representative_stage_is_the_first_with_that_role():
    layout = Layout(1, 4)
    assert [layout.representative_stage(r) for r in ("first", "middle", "last")] == [0, 1, 3]
    with pytest.raises(ConfigError, match="valid roles: first, middle, last"):
        layout.representative_stage("only")


def test_groups_dp2_pp2():
    layout = Layout(2, 2)
    assert layout.groups == {
        "dp/stage0": GroupSpec("dp/stage0", (0, 2)),
        "dp/stage1": GroupSpec("dp/stage1", (1, 3)),
        "pp/replica0/0-1": GroupSpec("pp/replica0/0-1", (0, 1)),
        "pp/replica1/0-1": GroupSpec("pp/replica1/0-1", (2, 3)),
    }
    assert [g.name for g in layout.groups_of(1)] == ["dp/stage1", "pp/replica0/0-1"]
    assert layout.dp_group(3) == "dp/stage1"
    assert layout.pp_prev(0) is None and layout.pp_next(0) == "pp/replica0/0-1"
    assert layout.pp_prev(3) == "pp/replica1/0-1" and layout.pp_next(3) is None


def test_groups_dp2_pp3():
    layout = Layout(2, 3)
    assert {n: g.members for n, g in layout.groups.items()} == {
        "dp/stage0": (0, 3),
        "dp/stage1": (1, 4),
        "dp/stage2": (2, 5),
        "pp/replica0/0-1": (0, 1),
        "pp/replica0/1-2": (1, 2),
        "pp/replica1/0-1": (3, 4),
        "pp/replica1/1-2": (4, 5),
    }
    assert [g.name for g in layout.groups_of(4)] == ["dp/stage1", "pp/replica1/0-1", "pp/replica1/1-2"]
    assert layout.pp_prev(4) == "pp/replica1/0-1" and layout.pp_next(4) == "pp/replica1/1-2"


def test_group_rank_is_the_position_in_members():
    g = Layout(3, 2).groups["dp/stage1"]
    assert g.members == (1, 3, 5)
    assert [g.group_rank(r) for r in g.members] == [0, 1, 2]


def test_tensor_parallel_names_carry_the_tp_rank():
    layout = Layout(1, 2, 2)
    assert sorted(layout.groups) == [
        "dp/stage0/tp0",
        "dp/stage0/tp1",
        "dp/stage1/tp0",
        "dp/stage1/tp1",
        "pp/replica0/0-1/tp0",
        "pp/replica0/0-1/tp1",
        "tp/replica0/stage0",
        "tp/replica0/stage1",
    ]
    assert layout.groups["pp/replica0/0-1/tp1"].members == (1, 3)
    assert layout.groups["tp/replica0/stage1"].members == (2, 3)


def test_dp2_pp2_tp2_names_every_rank_by_its_coordinates_and_groups():
    layout = Layout(2, 2, 2)
    assert [(c.dp, c.stage, c.tp) for c in map(layout.coord, range(8))] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (0, 1, 1),
        (1, 0, 0),
        (1, 0, 1),
        (1, 1, 0),
        (1, 1, 1),
    ]
    # rank 3 = (dp 0, stage 1, tp 1): its DP group (same pp, tp), its pipeline pair (same tp), its TP group
    assert [g.name for g in layout.groups_of(3)] == ["dp/stage1/tp1", "pp/replica0/0-1/tp1", "tp/replica0/stage1"]
    assert layout.groups["dp/stage1/tp1"].members == (3, 7)
    assert layout.tp_group(3) == "tp/replica0/stage1" and Layout(2, 2).tp_group(3) is None
    assert layout.dp_group(3) == "dp/stage1/tp1"
    assert layout.pp_prev(3) == "pp/replica0/0-1/tp1" and layout.pp_next(1) == "pp/replica0/0-1/tp1"
    # the delta switch rebuilds the leaver's groups only
    assert layout.affected_groups({5}) == ["dp/stage0/tp1", "pp/replica1/0-1/tp1", "tp/replica1/stage0"]
    assert len(layout.groups) == 4 + 4 + 4


def test_shards_name_stage_and_tp_position():
    layout = Layout(2, 2, 2)
    assert layout.shards == 4
    assert [layout.shard(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert layout.shard_names == ["stage0-tp0", "stage0-tp1", "stage1-tp0", "stage1-tp1"]
    assert Layout(2, 3).shard_names == ["stage0", "stage1", "stage2"]  # tp = 1 keeps the stage names
    assert [Layout(2, 3).shard(r) for r in range(6)] == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize(
    "n_layer, pp, classes",
    [
        (None, 4, [("first", (0,)), ("middle", (1, 2)), ("last", (3,))]),
        (8, 8, [("first", (0,)), ("middle", tuple(range(1, 7))), ("last", (7,))]),
        (4, 1, [("only", (0,))]),
        (10, 4, [("first", (0,)), ("middle-3b", (1,)), ("middle-2b", (2,)), ("last", (3,))]),
        (11, 6, [("first", (0,)), ("middle", (1, 2, 3, 4)), ("last", (5,))]),
        (14, 6, [("first", (0,)), ("middle-3b", (1,)), ("middle-2b", (2, 3, 4)), ("last", (5,))]),
        (9, 6, [("first", (0,)), ("middle-2b", (1, 2)), ("middle-1b", (3, 4)), ("last", (5,))]),
    ],
)
def test_shape_classes_group_stages_by_role_and_size(n_layer, pp, classes):
    layout = Layout(1, pp, n_layer=n_layer)
    assert [(c.name, c.stages) for c in layout.shape_classes] == classes
    assert layout.roles == tuple(name for name, _ in classes)
    for c in layout.shape_classes:
        assert layout.representative_stage(c.name) == c.stages[0] == c.representative
        assert {layout.shape_class(layout.rank(0, j)).name for j in c.stages} == {c.name}
        assert len({layout.stage_blocks(j) for j in c.stages}) == 1


def test_layout_from_config_and_pp_beyond_layers():
    from types import SimpleNamespace as NS

    cfg = NS(parallel=NS(dp=2, pp=2, tp=2, zero=0), model=NS(n_layer=4))
    assert Layout.from_config(cfg) == Layout(2, 2, 2, n_layer=4)
    cfg.parallel.zero = 1
    assert Layout.from_config(cfg) == Layout(2, 2, 2, n_layer=4, zero=1)
    with pytest.raises(ConfigError, match="parallel.pp=5"):
        Layout(1, 5, n_layer=4)


def test_dp1_groups_are_single_member():
    layout = Layout(1, 2)
    assert layout.groups["dp/stage0"].members == (0,)
    assert layout.groups["pp/replica0/0-1"].members == (0, 1)


@pytest.mark.parametrize(
    "dp, pp, ranks, expected",
    [
        (2, 2, {1}, ["dp/stage1", "pp/replica0/0-1"]),
        (2, 2, {0, 1}, ["dp/stage0", "dp/stage1", "pp/replica0/0-1"]),
        (2, 3, {1}, ["dp/stage1", "pp/replica0/0-1", "pp/replica0/1-2"]),
        (2, 3, {5}, ["dp/stage2", "pp/replica1/1-2"]),
        (2, 3, set(), []),
    ],
)
def test_affected_groups(dp, pp, ranks, expected):
    assert Layout(dp, pp).affected_groups(ranks) == expected


@pytest.mark.parametrize(
    "n_layer, pp, sizes",
    [
        (4, 1, [4]),
        (4, 2, [2, 2]),
        (4, 3, [2, 1, 1]),
        (4, 4, [1, 1, 1, 1]),
        (5, 3, [2, 2, 1]),
        (6, 4, [2, 2, 1, 1]),
        (7, 2, [4, 3]),
    ],
)
def test_split_layers_is_balanced_contiguous_and_complete(n_layer, pp, sizes):
    ranges = split_layers(n_layer, pp)
    assert [len(r) for r in ranges] == sizes
    assert max(sizes) - min(sizes) <= 1
    assert [b for r in ranges for b in r] == list(range(n_layer))


def test_split_layers_more_stages_than_layers_names_the_override():
    with pytest.raises(ConfigError, match=r"parallel.pp=5 is greater than model.n_layer=4"):
        split_layers(4, 5)
