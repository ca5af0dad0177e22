"""The bytes `docker load` of an image writes under an engine's data root, from what the engine that holds it says.

Docker's graph-driver image store (overlay2; Debian's docker.io 20.10) untars the whole `docker save` archive,
every layer, into a folder under the data root (tmp/docker-import-*) before it extracts the layers the engine lacks,
and removes that folder at the end (moby's image/tarexport/load.go). The peak is then the image's size (.Size, the
sum of its layers' sizes) plus the size of the layers the engine lacks; measured on 20.10 with a 64 MiB image: 128 MiB
at the peak, 64 MiB kept; with its 48 MiB base layer held, 80 MiB. Tar headers and block rounding are not counted.

Docker's containerd image store writes under containerd's root instead: each of the archive's layer blobs as it
comes (compressed where the image was built or pulled so) into the content store, then each layer the engine lacks
unpacked into a snapshot. There .Size is the blobs' size and `docker history` gives each layer's unpacked size, so
the count is .Size plus the unpacked size of the layers the engine lacks; a held layer's blob counts, since the
engine may hold it compressed otherwise. Least free space a load took on Debian 13's Docker 26.1 (ext4, MiB) against
the count: a 16 MiB random base and a 16 MiB random top, uncompressed: 65 (64 counted), with the base held 33 (48);
the same base gzipped under 64 MiB of zeros (16.3 MiB of blobs): 98 (96.3), with the base held 65 (80.2), where
twice .Size would count 32.6.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence


def _held_layers(layers: Sequence[str], held: Iterable[Sequence[str]]) -> int:
    """How many of the image's lowest layers the engine holds: a layer is the one held only on the same layers below
    it (its chain ID), so it is the longest run of `layers` that one of the engine's images starts with."""
    longest = 0
    for other in held:
        same = 0
        while same < min(len(layers), len(other)) and layers[same] == other[same]:
            same += 1
        longest = max(longest, same)
    return longest


def _layer_sizes(layers: Sequence[str], history: Sequence[int]) -> list[int] | None:
    """Each layer's size, lowest first, from `docker history`'s sizes (newest first: one per layer and a 0 for each
    step that made none, ENV or LABEL); None where it lists more sizes than the image has layers. A layer that
    changes nothing lists 0 too, so the zeros are taken to be the lowest layers: that never overstates what the
    lowest layers hold, nor understates what the layers above them hold."""
    sizes = [s for s in reversed(history) if s]
    if len(sizes) > len(layers):
        return None
    return [0] * (len(layers) - len(sizes)) + sizes


def _size_of_lowest(size: int, layers: Sequence[str], history: Sequence[int], count: int) -> int:
    """The size of the image's `count` lowest layers, or less where `docker history` cannot tell: a history that does
    not add up to the image's size (none at all, for an image made without one) sizes nothing, so every layer counts
    as lacking unless the engine holds them all."""
    if count == len(layers):
        return size
    sizes = _layer_sizes(layers, history)
    return sum(sizes[:count]) if sizes is not None and sum(sizes) == size else 0


def _unpacked_above(layers: Sequence[str], history: Sequence[int], count: int) -> int | None:
    """The unpacked size of the image's layers above its `count` lowest, from a containerd store's `docker history`
    (its sizes are the layers' unpacked sizes): every size where it lists more than the image has layers; None where
    it sizes no layer."""
    if layers and not any(history):
        return None
    sizes = _layer_sizes(layers, history)
    return sum(history) if sizes is None else sum(sizes[count:])


def load_needs(size: int, layers: Sequence[str], history: Sequence[int], held: Iterable[Sequence[str]],
               containerd: bool = False) -> int:
    """Bytes `docker load` of an image writes at its peak under the data root of an engine whose images have the
    layer lists `held`: the archive, then the layers the engine lacks. `size` and `layers` are the image's .Size and
    .RootFS.Layers, `history` its `docker history` sizes (newest first), all as the engine holding it says;
    `containerd`: both engines keep their images in containerd (where a history that sizes no layer, as an image
    made without one has, leaves twice .Size)."""
    count = _held_layers(layers, held)
    if containerd and (unpacked := _unpacked_above(layers, history, count)) is not None:
        return size + unpacked
    return 2 * size - _size_of_lowest(size, layers, history, count)
