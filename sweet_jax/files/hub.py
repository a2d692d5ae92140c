"""Models named by a Hugging Face Hub id: `local_model(name)` turns a model setting into a local directory.

A setting that names a model (`model.hf_path`, `policy_init`, `simulator`, `serve --model`, `best_of_n --model`,
`evaluate_model --model`, an adapter) takes either a local directory or a Hub id, `owner/name` or `owner/name@REVISION`
(a branch, a tag or a commit, pinned). A name that exists on disk is always the local path. A Hub id is downloaded
by `huggingface_hub` into its cache (`HF_HUB_CACHE`, by default `~/.cache/huggingface/hub`; only the files a model
needs: configs, safetensors weights, tokenizer and chat template, never `original/`'s consolidated checkpoints), with
a progress bar, once; afterwards, and offline (`HF_HUB_OFFLINE=1`), it is read from the cache, as vLLM and
transformers read it. Errors say which id, which revision, and what is missing.

A data file of a Hub dataset is named `owner/name[@REVISION]:path/in/repo.jsonl` (task sets, trajectories):
`local_dataset_file` downloads that one file into the same cache, or finds it there offline.
"""

from __future__ import annotations

import os
import re

from sweet_jax.files.errors import DataError

HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?")
HUB_FILE = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?:(?P<file>[^:]+)")
MODEL_FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken")
SKIPPED = ("original/*",)  # the consolidated PyTorch checkpoints of Meta's repositories: as large as the weights


class HubError(DataError):
    """A Hub id that cannot be turned into a local directory: not found, not in the cache offline, incomplete."""


def _hub_name(name: str, pattern: re.Pattern) -> re.Match | None:
    """`pattern`'s match of `name`, unless `name` is a path: one that exists here, or starts like one."""
    if not name or os.path.exists(name) or name.startswith(("/", ".", "~")):
        return None
    return pattern.fullmatch(name)


def hub_id(name: str) -> tuple[str, str | None] | None:
    """(repository, revision or None) when `name` is a Hub id and not a path that exists here; else None."""
    m = _hub_name(name, HUB_ID)
    return (m["repo"], m["revision"]) if m else None


def display_name(name: str) -> str:
    """The short name a model is served and reported under: a directory's name; a Hub id's model name, also for the
    id's snapshot in the Hub cache (`.../models--owner--name/snapshots/COMMIT`)."""
    found = hub_id(name)
    if found:
        return found[0].rsplit("/", 1)[-1]
    parts = os.path.abspath(name).split(os.sep)
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].split("--", 2)[-1]
    return parts[-1]


def local_model(name: str, what: str = "model", needs: tuple[str, ...] = ("config.json",)) -> str:
    """`name` as a local directory: itself when it exists (or is not a Hub id, for the caller's own error), else the
    Hub id's snapshot in the Hub cache, downloaded first unless offline. `needs`: files the snapshot must hold."""
    found = hub_id(name)
    if found is None:
        return name
    repo, revision = found
    import huggingface_hub
    from huggingface_hub import constants, errors

    at = f"{repo!r} (revision {revision or 'main'})"
    offline = constants.HF_HUB_OFFLINE
    cache = constants.HF_HUB_CACHE
    try:
        path = huggingface_hub.snapshot_download(repo, revision=revision, allow_patterns=list(MODEL_FILES),
                                                 ignore_patterns=list(SKIPPED))
    except errors.LocalEntryNotFoundError:
        how = ("the Hub is offline (HF_HUB_OFFLINE=1)" if offline else "the Hub could not be reached")
        raise HubError(f"{what} {at}: not a local directory, and not in the Hub cache {cache}, and {how}; "
                       f"download it (`huggingface-cli download {repo}"
                       f"{' --revision ' + revision if revision else ''}`) or give a local directory") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{what} {at}: the repository has no revision {revision!r}") from None
    except errors.GatedRepoError:
        raise HubError(f"{what} {at}: a gated repository; accept its licence on the Hub and log in "
                       f"(`huggingface-cli login`, or HF_TOKEN)") from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"{what} {at}: not a local directory, and no such repository on the Hub (or it is private: "
                       f"log in with `huggingface-cli login`, or set HF_TOKEN)") from None
    missing = [f for f in needs if not os.path.exists(os.path.join(path, f))]
    if missing:
        raise HubError(f"{what} {at}: its snapshot {path} has no {', '.join(missing)}"
                       + (" (the cache holds part of it; run once online to complete it)" if offline else ""))
    return path


def hub_file(name: str) -> tuple[str, str | None, str] | None:
    """(dataset repository, revision or None, file) when `name` is `owner/name[@revision]:file` and not a path that
    exists here; else None."""
    m = _hub_name(name, HUB_FILE)
    return (m["repo"], m["revision"], m["file"]) if m else None


def local_dataset_file(name: str) -> str:
    """The local path of `name`: itself when it is not `owner/name[@revision]:file`, else that file of the Hub dataset,
    from the Hub cache (downloaded first unless offline)."""
    found = hub_file(name)
    if found is None:
        return name
    repo, revision, file = found
    import huggingface_hub
    from huggingface_hub import constants, errors

    at = (f"{name}: not a local file, and the hub could not provide it: {file!r} of the Hub dataset {repo!r} "
          f"(revision {revision or 'main'})")
    try:
        return huggingface_hub.hf_hub_download(repo, file, repo_type="dataset", revision=revision)
    except errors.LocalEntryNotFoundError:
        how = "the Hub is offline (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        raise HubError(f"{at} is not in the Hub cache {constants.HF_HUB_CACHE}, and {how}; download it "
                       f"(`huggingface-cli download --repo-type dataset {repo} {file}"
                       f"{' --revision ' + revision if revision else ''}`) or give a local file") from None
    except errors.EntryNotFoundError:
        raise HubError(f"{at}: the repository has no such file") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{at}: the repository has no revision {revision!r}") from None
    except errors.GatedRepoError:
        raise HubError(f"{at}: a gated repository; accept its terms on the Hub and log in") from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"{at}: no such dataset on the Hub (or it is private: log in, or set HF_TOKEN)") from None
