"""Print the source's manifest shape, {"files": {name: {"size": bytes}}}, of a Hugging Face model repository's files
at a revision (arguments: the id, then a branch, tag or commit, or '' for the default branch) as the Hub lists them,
for the weights role to weigh a download against the free space. Run with the Python the `hf` command runs on, which
holds huggingface_hub; it reads HF_ENDPOINT and HF_TOKEN_PATH as `hf download` does.
Anything that stops it is one line on stderr starting "hub_sizes: ", which the role repeats."""
import json
import sys

try:
    from huggingface_hub import HfApi

    info = HfApi().model_info(sys.argv[1], revision=(sys.argv[2:3] or [""])[0] or None, files_metadata=True)
    files = {s.rfilename: s.size for s in info.siblings}
except Exception as e:  # noqa: BLE001 - whatever stops it (no huggingface_hub, the network, a 401) is said, not raised
    sys.exit(f"hub_sizes: {type(e).__name__}: {' '.join(str(e).split())}")
if any(size is None for size in files.values()):
    sys.exit(f"hub_sizes: the Hub gave no size for {', '.join(name for name, size in files.items() if size is None)}")
print(json.dumps({"files": {name: {"size": size} for name, size in files.items()}}))
