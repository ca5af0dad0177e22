"""The bytes `docker load` of an image writes under an engine's data root, from what the engine that holds it says.

Docker's graph-driver image store (overlay2; Debian's docker.io 20.10) untars the whole `docker save` archive,
every layer, into a folder under the data root (tmp/docker-import-*) before it extracts the layers the engine lacks,
and removes that folder at the end (moby's image/tarexport/load.go). The peak is then the image's size (.Size, the
sum of its layers' sizes) plus the size of the layers the engine lacks; measured on 20.10 with a 64 MiB image: 128 MiB
at the peak, 64 MiB kept; with its 48 MiB base layer held, 80 MiB. Tar headers and block rounding are not counted.

Docker's containerd image store writes under containerd's root instead: the archive's layers into its content store,
then each layer the engine lacks unpacked into a snapshot. Measured on Debian 13's Docker 26.1 with a 66 MiB image:
132 MiB with nothing held, as here; 64 MiB with its 50 MiB base held, under the 82 MiB counted here. There
`docker history` gives each layer's disk usage, which does not add up to the image's size, so what is held counts
as nothing: twice the image.
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


def _size_of_lowest(size: int, layers: Sequence[str], history: Sequence[int], count: int) -> int:
    """The size of the image's `count` lowest layers, or less where `docker history` cannot tell.

    `history` is `docker history`'s sizes, newest first: one per layer and a 0 for each step that made none
    (ENV, LABEL). A layer that changes nothing lists 0 too, so those are taken to be the lowest ones, which never
    overstates what is held. A history that does not add up to the image's size (none at all, for an image made
    without one) sizes nothing: every layer counts as lacking unless the engine holds them all."""
    if count == len(layers):
        return size
    sizes = [s for s in reversed(history) if s]
    if len(sizes) > len(layers) or sum(sizes) != size:
        return 0
    return sum(sizes[:max(0, count - (len(layers) - len(sizes)))])


def load_needs(size: int, layers: Sequence[str], history: Sequence[int], held: Iterable[Sequence[str]]) -> int:
    """Bytes `docker load` of an image writes at its peak under the data root of an engine whose images have the
    layer lists `held`: the archive, then the layers the engine lacks. `size` and `layers` are the image's .Size and
    .RootFS.Layers, `history` its `docker history` sizes (newest first), all as the engine holding it says."""
    return 2 * size - _size_of_lowest(size, layers, history, _held_layers(layers, held))
