"""What `docker load` of the serving image needs under a node's Docker data root (dsaops/image_load.py).

tests/playbooks/test_staging.py loads images into a real dockerd on a small filesystem; these are the cases it does not
build: an image without a history, layers that change nothing, a layer held on other layers below it."""
from dsaops.image_load import load_needs

MIB = 1 << 20
LAYERS = ["sha256:base", "sha256:python", "sha256:app"]
SIZES = [30 * MIB, 10 * MIB, 2 * MIB]                            # oldest first
SIZE = sum(SIZES)
HISTORY = [2 * MIB, 0, 10 * MIB, 0, 0, 30 * MIB]                 # newest first, as `docker history` lists; 0: ENV, LABEL


def test_the_whole_archive_counts_and_the_layers_the_node_lacks_on_top():
    assert load_needs(SIZE, LAYERS, HISTORY, []) == 2 * SIZE
    assert load_needs(SIZE, LAYERS, HISTORY, [["sha256:other"]]) == 2 * SIZE
    assert load_needs(SIZE, LAYERS, HISTORY, [LAYERS[:1], ["sha256:other"]]) == SIZE + 12 * MIB
    assert load_needs(SIZE, LAYERS, HISTORY, [LAYERS[:1], LAYERS[:2] + ["sha256:older-app"]]) == SIZE + 2 * MIB
    assert load_needs(SIZE, LAYERS, HISTORY, [LAYERS + ["sha256:on-top"]]) == SIZE    # held, the archive still spooled


def test_a_layer_is_held_only_on_the_same_layers_below_it():
    assert load_needs(SIZE, LAYERS, HISTORY, [["sha256:other", "sha256:python", "sha256:app"]]) == 2 * SIZE


def test_without_a_history_that_adds_up_every_layer_counts_unless_all_are_held():
    for history in ([], [SIZE + 1], [MIB] * 4):
        assert load_needs(SIZE, LAYERS, history, [LAYERS[:2]]) == 2 * SIZE
        assert load_needs(SIZE, LAYERS, history, [LAYERS]) == SIZE


def test_layers_that_change_nothing_never_make_the_held_part_look_larger():
    """A fourth layer, on top, that changes nothing lists 0, as an ENV step does: the history cannot say which 0 it is,
    so it is taken to be the lowest layer, and holding the two lowest counts only the base as held (at most the truth)."""
    layers = LAYERS + ["sha256:empty"]
    assert load_needs(SIZE, layers, HISTORY, [layers[:2]]) == SIZE + 12 * MIB
    assert load_needs(SIZE, layers, HISTORY, [layers[:3]]) == SIZE + 2 * MIB


# A containerd store: .Size is the layers' blobs as they came (here gzipped), `docker history` their unpacked sizes.
BLOBS = 9 * MIB


def test_into_containerd_every_blob_counts_and_the_layers_the_node_lacks_unpacked():
    assert load_needs(BLOBS, LAYERS, HISTORY, [], containerd=True) == BLOBS + SIZE
    assert load_needs(BLOBS, LAYERS, HISTORY, [LAYERS[:1]], containerd=True) == BLOBS + 12 * MIB
    assert load_needs(BLOBS, LAYERS, HISTORY, [LAYERS[:2], ["sha256:other"]], containerd=True) == BLOBS + 2 * MIB
    assert load_needs(BLOBS, LAYERS, HISTORY, [LAYERS], containerd=True) == BLOBS
    # twice the blobs, what Docker's own store counts, would be 18 MiB where the load writes 51
    assert load_needs(BLOBS, LAYERS, HISTORY, [], containerd=False) == 2 * BLOBS


def test_into_containerd_the_history_never_understates_what_is_lacking():
    layers = LAYERS + ["sha256:empty"]
    assert load_needs(BLOBS, layers, HISTORY, [layers[:2]], containerd=True) == BLOBS + 12 * MIB
    assert load_needs(BLOBS, LAYERS, [MIB] * 4, [LAYERS[:2]], containerd=True) == BLOBS + 4 * MIB
    # no history sizes no layer: twice .Size, as for Docker's own store
    assert load_needs(BLOBS, LAYERS, [], [LAYERS[:2]], containerd=True) == 2 * BLOBS
