import pytest
import torch

from strategies import DraftTree


def test_paper_tree_sizes():
    assert DraftTree.from_widths((3, 3, 3)).num_nodes == 39
    assert DraftTree.from_widths((2, 2, 2)).num_nodes == 14
    chain = DraftTree.from_widths((1, 1, 1))
    assert chain.parents == (-1, 0, 1) and chain.is_chain
    assert DraftTree.chain(64).num_nodes == 64


def test_root_puts_one_node_above_the_drafts():
    t = DraftTree.from_widths((3, 3, 3), root=True)
    assert t.num_nodes == 40 and t.num_drafts == 39 and t.has_root
    assert t.parents[0] == -1 and t.parents.count(-1) == 1
    assert t.children(0) == [1, 14, 27]  # DFS preorder: each subtree of 13 is contiguous
    c = DraftTree.chain(3, root=True)
    assert c.parents == (-1, 0, 1, 2) and c.draft_depth == 3 and c.path_length == 4


def test_dfs_preorder_layout_and_depths():
    t = DraftTree.from_widths((2, 2))
    assert t.parents == (-1, 0, 0, -1, 3, 3)
    assert t.depths == (0, 1, 1, 0, 1, 1)
    assert t.levels == ((0, 3), (1, 2, 4, 5))
    assert t.widths == (2, 2) and t.label == "2,2"


def test_paths_ancestors_and_mask():
    t = DraftTree.from_widths((3, 3, 3))
    leaf = 38
    assert t.path_to(leaf) == [26, 35, 38]
    assert t.ancestors(leaf) == [35, 26]
    assert t.path_to(-1) == []
    m = t.ancestor_mask()
    assert m.shape == (39, 39) and m.dtype == torch.bool
    assert torch.equal(m, m.tril())
    assert int(m.sum()) == 3 * 1 + 9 * 2 + 27 * 3  # node at depth d has d+1 entries on its path
    assert not t.ancestor_mask(inclusive=False).diagonal().any()
    for node in range(39):
        assert m[node].nonzero().flatten().tolist() == t.path_to(node)


def test_labels_and_widths():
    assert DraftTree.chain(7, root=True).label == "chain:7+root"
    assert DraftTree.from_widths((3, 3, 3)).label == "3,3,3"
    assert DraftTree((-1, 0, 1, 0)).widths is None
    assert DraftTree((-1, 0, 1, 0)).label == "tree:4"


@pytest.mark.parametrize("parents, match", [
    ((), "at least one node"),
    ((-1, 2, 0), "parent must come before"),
    ((-1, 2, 1), "cycle"),
    ((1, 0), "cycle"),
    ((-1, 0, 5), r"parents\[2\]=5"),
    ((-1, -2), r"parents\[1\]=-2"),
    ((-1, 0, 1, 0, 2), "not DFS preorder"),
])
def test_bad_trees_raise_clear_errors(parents, match):
    with pytest.raises(ValueError, match=match):
        DraftTree(parents)


def test_root_flag_needs_a_single_top_node():
    with pytest.raises(ValueError, match="has_root=True"):
        DraftTree((-1, 0, -1), has_root=True)


@pytest.mark.parametrize("widths", [(), (2, 0), (-1,)])
def test_bad_widths(widths):
    with pytest.raises(ValueError, match="width"):
        DraftTree.from_widths(widths)


def test_node_index_checked():
    with pytest.raises(IndexError, match="node=3"):
        DraftTree.chain(3).path_to(3)


def test_from_widths_is_the_recursive_preorder_and_takes_chains_longer_than_pythons_recursion_limit():
    def recursive(widths, root):     # the definition: each node, then its subtree, siblings left to right
        parents = [-1] if root else []

        def grow(parent, depth):
            for _ in range(widths[depth]):
                me = len(parents)
                parents.append(parent)
                if depth + 1 < len(widths):
                    grow(me, depth + 1)

        grow(0 if root else -1, 0)
        return tuple(parents)

    for widths in ((3, 3, 3), (2, 1, 3), (1, 4), (3, 2, 2, 1), (1, 1, 1)):
        for root in (False, True):
            assert DraftTree.from_widths(widths, root=root).parents == recursive(widths, root), (widths, root)
    long = DraftTree.chain(5000, root=True)
    assert long.num_drafts == 5000 and long.is_chain and long.draft_depth == 5000
