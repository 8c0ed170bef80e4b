"""Action `edgekit_blobs`: make `<store>/<sha256>` exist on the board for every blob of a release.

Like edgekit's push (edgekit.remote.transfer): one command lists what the board has, only missing
blobs are sent, each to `<sha>.part`, the board hashes the uploads, and a verified `.part` is
renamed into place with its mode; a mismatch is deleted and fails the task. Small blobs travel
together as one tar stream on one command (a release has dozens of small files: libraries, the
agent, units), large ones one SFTP put each; the board checks the uploads in the same command as the
last tar stream. No Ansible module runs on the board (edgekit's own sh and `python3 -c` scripts do),
so a fresh push costs two round trips, not several module runs per file. Unless the board has it,
the release directory is then made from the store (edgekit's CREATE_PY) in that same command.
Supports check mode: reports what would be sent and sends nothing.

A board of a site (``plan.site``: the sources, its seed first, that `edgekit fleet rollout` started nginx on)
first takes the missing blobs from its neighbours (edgekit's agent/site_pull.py: aria2c, then the board's own
sha256, a wrong copy deleted and the next source tried); what none of them could give is sent as above.

Options (what `edgekit fleet rollout` planned; the task passes them whole, since Ansible 2.19 would
compile a template per derived argument in every worker):
  plan:   the board's plan (edgekit.fleet.plan.BoardPlan.to_vars, with the state edgekit read): base
          (absolute; the store is <base>/store), blobs (sha256s), release, files ([path, sha256, ...]);
          the release is made unless state.has_release; site (optional): sources (URLs, in order), staging
  fleet:  edgekit_fleet: blobs ({sha256: {sha256, src (local path), size, executable}}) and scripts
          ({inventory, inventory_ro, place, create, site_pull}: board-side programs)
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import tarfile
import time
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

_SHA = re.compile(r"^[0-9a-f]{64}$")
FREE_MARGIN_BYTES = 16 << 20  # as edgekit's push: plus 1 % of the payload
SMALL_BLOB = 16 << 20  # blobs up to this size go in the tar stream ...
TAR_BATCH = 64 << 20  # ... up to this much per stream (it is held in memory)
# `sh -c UNTAR sh STORE`: unpack the stream of <sha>.part files into the store, as this user.
UNTAR_SH = 'exec tar -x -o -f - -C "$1"'
# `sh -c UNTAR_THEN sh STORE COMMAND...`: the same, then the command (exit UNTAR_FAILED if tar failed).
UNTAR_FAILED = 97
UNTAR_THEN_SH = f'tar -x -o -f - -C "$1" || exit {UNTAR_FAILED}; shift; exec "$@"'


class ActionModule(ActionBase):
    TRANSFERS_FILES = False  # put_file targets the store itself: no remote tmp dir
    _supports_check_mode = True
    _requires_connection = True

    def _run(self, argv: list[str], data: bytes | None = None) -> dict[str, Any]:
        # executable=False, as the raw action: the command runs as given, not wrapped in another
        # `/bin/sh -c '… && sleep 0'` (two more processes on the board per command).
        return self._low_level_execute_command(shlex.join(argv), sudoable=False, in_data=data, executable=False)

    def _sh(self, script: str, *args: str) -> dict[str, Any]:
        return self._run(["sh", "-c", script, "sh", *args])

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        plan, fleet = self._task.args.get("plan") or {}, self._task.args.get("fleet") or {}
        store = f"{plan.get('base') or ''}/store"
        scripts = fleet.get("scripts") or {}
        table = fleet.get("blobs") or {}
        if any(sha not in table for sha in plan.get("blobs") or []):
            raise AnsibleError("edgekit_blobs: the plan names a blob the fleet's table lacks")
        blobs = self._blobs([table[sha] for sha in plan.get("blobs") or []])
        release = None if (plan.get("state") or {}).get("has_release") else \
            {"base": plan.get("base"), "id": plan.get("release"), "files": plan.get("files")}
        if not store.startswith("/"):
            raise AnsibleError(f"edgekit_blobs: store {store!r} is not an absolute path")
        check = bool(self._task.check_mode)
        listing = self._sh(scripts["inventory_ro" if check else "inventory"], store, *blobs)
        if listing.get("rc") != 0:
            return {**result, "failed": True, "msg": f"Cannot prepare the store {store}: {self._why(listing)}."}
        have: dict[str, bool] = {}
        free_kb: int | None = None
        for line in listing.get("stdout", "").splitlines():
            word, _, rest = line.partition(" ")
            parts = rest.split()
            if word == "have" and len(parts) == 2:
                have[parts[0]] = parts[1] == "x"
            elif word == "free" and parts and parts[0].isdigit():
                free_kb = int(parts[0])
        missing = [s for s in blobs if s not in have]
        to_send = sum(blobs[s]["size"] for s in missing)
        needed = to_send + FREE_MARGIN_BYTES + to_send // 100 if missing else 0
        relink = [s for s, b in blobs.items() if have.get(s) is False and b["executable"]]
        report = {"sent_blobs": 0, "sent_bytes": 0, "skipped_blobs": len(blobs) - len(missing),
                  "missing_blobs": len(missing), "missing_bytes": to_send}
        result.update(report)
        result["changed"] = bool(missing or relink)
        if free_kb is not None and free_kb * 1024 < needed:
            return {**result, "failed": True, "changed": False,
                    "msg": f"The board has {free_kb * 1024 / 1e6:.1f} MB free in {store} but the push needs "
                           f"{needed / 1e6:.1f} MB ({to_send / 1e6:.1f} MB of blobs + margin); nothing was sent."}
        create = self._create_argv(release, scripts)
        result["release_created"] = False
        if check:
            return result
        if not result["changed"]:
            return self._create(result, create) if create else result
        site = plan.get("site") or {}
        if missing and site.get("sources") and site.get("staging"):  # the site's boards first; the rest below
            result["site"] = self._site_pull(store, site, scripts, blobs, missing)
            still = set(result["site"].get("missing") or [])
            result["pulled_blobs"] = len(missing) - len(still)
            result["pulled_bytes"] = result["site"].get("bytes", 0)
            missing = [s for s in missing if s in still]
        for sha in relink:  # same content, now needed executable (edgekit's push does the same)
            self._sh('chmod 0755 "$1/$2"', store, sha)
        for sha in missing:
            src = blobs[sha]["src"]
            if not os.path.isfile(src) or os.path.getsize(src) != blobs[sha]["size"]:
                size = blobs[sha]["size"]
                return {**result, "failed": True, "msg": f"The local file {src} for blob {sha[:12]} is missing "
                                                         f"or not {size} bytes; rebuild the artifact."}
        for sha in missing:
            if blobs[sha]["size"] > SMALL_BLOB:
                self._connection.put_file(blobs[sha]["src"], f"{store}/{sha}.part")
        batches = self._batches([s for s in missing if blobs[s]["size"] <= SMALL_BLOB], blobs)
        for batch in batches[:-1]:
            sent = self._sh_in(UNTAR_SH, self._tar(batch, blobs), store)
            if sent.get("rc") != 0:
                return self._unpack_failed(result, store, sent)
        # The last tar stream and the check of every upload in one command: one round trip fewer.
        return self._place(result, store, scripts, blobs, missing, create,
                           self._tar(batches[-1], blobs) if batches else None)

    def _site_pull(self, store: str, site: dict[str, Any], scripts: dict[str, str], blobs: dict[str, Any],
                   missing: list[str]) -> dict[str, Any]:
        """edgekit's agent/site_pull.py on the board (aria2c from ``site.sources`` in order, each blob checked by
        the board's own sha256; the spec on stdin); never fails the task: what it lacks after, the caller sends.
        Per board: bytes and blobs taken, from which source, what is still missing, copies rejected."""
        spec = {"store": store, "staging": str(site["staging"]), "sources": list(site["sources"]),
                "blobs": [{"sha256": s, "size": blobs[s]["size"], "executable": blobs[s]["executable"]}
                          for s in missing]}
        res = self._run(["python3", "-c", scripts["site_pull"], "-"], json.dumps(spec).encode())
        try:
            out = json.loads(res.get("stdout") or "")
        except ValueError:
            out = {"error": f"site pull failed: {self._why(res)}"}
        if out.get("error") or not isinstance(out.get("blobs"), list):
            return {"error": str(out.get("error") or "site pull gave no result"), "missing": missing, "bytes": 0}
        got = [b for b in out["blobs"] if b.get("source") not in (None, "present")]
        sources: dict[str, int] = {}
        for b in got:
            sources[b["source"]] = sources.get(b["source"], 0) + 1
        return {"bytes": sum(int(b.get("bytes") or 0) for b in got), "blobs": len(got), "sources": sources,
                "missing": [b["sha256"] for b in out["blobs"] if b.get("source") is None],
                # why a blob is still missing: its last source's answer (aria2c's exit status and message)
                "why": {b["sha256"][:12]: (b.get("tries") or [{}])[-1] for b in out["blobs"]
                        if b.get("source") is None},
                # a copy that arrived whole but hashed wrong (our check, or aria2c's --checksum: exit 32)
                "rejected_copies": sum(1 for b in out["blobs"] for t in b.get("tries") or []
                                       if (t.get("exit") == 0 and not t.get("ok")) or t.get("exit") == 32),
                "seconds": out.get("seconds")}

    @staticmethod
    def _why(res: dict[str, Any], first: bool = False) -> str:
        """The last (or ``first``: tar's own reason comes before its summary) line the board's command wrote to
        stderr, or its exit status."""
        lines = (res.get("stderr") or "").strip().splitlines()
        return (lines[0] if first else lines[-1]) if lines else f"exit {res.get('rc')}"

    def _unpack_failed(self, result: dict[str, Any], store: str, res: dict[str, Any]) -> dict[str, Any]:
        return {**result, "failed": True, "msg": f"Unpacking blobs into {store} failed: {self._why(res, first=True)}."}

    def _sh_in(self, script: str, data: bytes, *args: str) -> dict[str, Any]:
        return self._run(["sh", "-c", script, "sh", *args], data)

    @staticmethod
    def _batches(shas: list[str], blobs: dict[str, Any]) -> list[list[str]]:
        out: list[list[str]] = []
        size = 0
        for sha in shas:
            if not out or size + blobs[sha]["size"] > TAR_BATCH:
                out.append([])
                size = 0
            out[-1].append(sha)
            size += blobs[sha]["size"]
        return out

    @staticmethod
    def _tar(shas: list[str], blobs: dict[str, Any]) -> bytes:
        """A tar of `<sha>.part` members (mode 0600; PLACE_PY gives each its final mode)."""
        buf = io.BytesIO()
        now = int(time.time())
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for sha in shas:
                info = tarfile.TarInfo(f"{sha}.part")
                info.size, info.mode, info.mtime = blobs[sha]["size"], 0o600, now
                with open(blobs[sha]["src"], "rb") as fh:
                    tar.addfile(info, fh)
        return buf.getvalue()

    @staticmethod
    def _create_argv(release: Any, scripts: dict[str, str]) -> list[str]:
        """`python3 -c CREATE_PY BASE ID [PATH SHA]...` for ``release``, or [] without one."""
        if not release:
            return []
        files = [str(f) for f in release.get("files") or []]
        if not str(release.get("base", "")).startswith("/") or not release.get("id") or len(files) % 2:
            raise AnsibleError(f"edgekit_blobs: release needs an absolute base, an id and path/sha256 pairs, "
                               f"not {release!r}")
        return ["python3", "-c", scripts["create"], str(release["base"]), str(release["id"]), *files]

    def _create(self, result: dict[str, Any], argv: list[str]) -> dict[str, Any]:
        made = self._run(argv)
        if made.get("rc") != 0:
            return {**result, "failed": True, "msg": f"Making the release directory failed: {self._why(made)}."}
        created = (made.get("stdout") or "").strip().endswith("created")
        return {**result, "release_created": created, "changed": result["changed"] or created}

    def _place(self, result: dict[str, Any], store: str, scripts: dict[str, str], blobs: dict[str, Any],
               missing: list[str], create: list[str], tar: bytes | None = None) -> dict[str, Any]:
        """Unpack ``tar`` (the last stream of uploads) into the store, then hash the uploads on the board;
        rename the good ones into place, delete the bad ones (PLACE_PY); then, with every one good, make the
        release (``create``) in the same command."""
        argv = ["python3", "-c", scripts["place"], store]
        for sha in missing:
            argv += [sha, "0755" if blobs[sha]["executable"] else "0644"]
        if create:
            argv += ["--", *create]
        placed = self._run(["sh", "-c", UNTAR_THEN_SH, "sh", store, *argv], tar) if tar is not None else self._run(argv)
        if placed.get("rc") == UNTAR_FAILED and tar is not None:
            return self._unpack_failed(result, store, placed)
        if placed.get("rc") != 0:
            what = "Verifying the uploads or making the release" if create else "Verifying the uploads"
            return {**result, "failed": True, "msg": f"{what} in {store} failed: {self._why(placed)}."}
        good, bad = set(), {}
        for line in placed.get("stdout", "").splitlines():
            word, *rest = line.split() or [""]
            if word == "ok" and rest:
                good.add(rest[0])
            elif word == "bad" and len(rest) == 2:
                bad[rest[0]] = rest[1]
        result["sent_blobs"] = len(good)
        result["sent_bytes"] = sum(blobs[s]["size"] for s in good)
        unsettled = [s for s in missing if s not in good]
        if unsettled:
            sha = unsettled[0]
            name = os.path.basename(blobs[sha]["src"])
            return {**result, "failed": True, "msg": f"{name} arrived with sha256 {bad.get(sha, 'missing')[:16]}…, "
                                                     f"not {sha[:16]}…; the upload was deleted."}
        if create:
            result["release_created"] = (placed.get("stdout") or "").strip().endswith("created")
        return result

    @staticmethod
    def _blobs(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for item in items:
            sha = str(item.get("sha256", ""))
            if not _SHA.match(sha):
                raise AnsibleError(f"edgekit_blobs: {sha!r} is not a sha256")
            prev = out.get(sha)
            entry = {"src": str(item["src"]), "size": int(item["size"]), "executable": bool(item.get("executable"))}
            # One file per content on the board: executable if any user needs it executable.
            if prev is None or entry["executable"]:
                out[sha] = entry
        return out
