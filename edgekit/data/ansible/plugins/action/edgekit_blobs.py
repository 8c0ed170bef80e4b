"""Action `edgekit_blobs`: make `<store>/<sha256>` exist on the board for every blob of a release.

Like edgekit's push (edgekit.remote.transfer), every board-side step is a verb of edgekit's agent (a zipapp
named by its hash under `<base>/agent/`, put there first when the board lacks it): `inventory` lists what
the board has (and, for a release it does not serve yet, `check` hashes those blobs again: a rotted copy is
sent anew), only missing blobs are sent, and a blob reaches its final name only once the board's sha256 of it
matches. Small blobs travel together as tar streams into `place --tar` (a release has dozens of small files:
libraries, units), large ones in pieces through `receive --upto`, resumed from what a cut rollout left. No
Ansible module runs on the board, so a fresh push costs a few round trips, not several module runs per file.
Unless the board has it, the release directory is then made from the store (the agent's `release-create`) in
the same command as the last tar stream. Supports check mode: reports what would be sent and sends nothing
(the agent itself is put in place if missing, as Ansible puts its own modules on a board in check mode).

A board of a site (``plan.site``: the sources, its seed first, that `edgekit fleet rollout` started nginx on)
first takes the missing blobs from its neighbours (edgekit's agent/site_pull.py: aria2c, then the board's own
sha256, a wrong copy deleted and the next source tried); what none of them could give is sent as above.

Options (what `edgekit fleet rollout` planned; the task passes them whole, since Ansible 2.19 would
compile a template per derived argument in every worker):
  plan:   the board's plan (edgekit.fleet.plan.BoardPlan.to_vars, with the state edgekit read): base
          (absolute; the store is <base>/store), blobs (sha256s), release, files ([path, sha256, ...]);
          the release is made unless state.has_release; site (optional): sources (URLs, in order), staging
  fleet:  edgekit_fleet: blobs ({sha256: {sha256, src (local path), size, executable}}), agent ({name, src,
          dir, python}: the zipapp)
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time
from typing import Any

from ansible.errors import AnsibleError
from ansible_collections.edgekit.fleet.plugins.plugin_utils.agent import AgentAction

_SHA = re.compile(r"^[0-9a-f]{64}$")
FREE_MARGIN_BYTES = 16 << 20  # as edgekit's push: plus 1 % of the payload
SMALL_BLOB = 16 << 20  # blobs up to this size go in the tar stream ...
PIECE = 32 << 20  # ... larger ones in pieces of this size, each one command (held in memory while it crosses)
TAR_BATCH = 64 << 20  # ... up to this much per stream (it is held in memory)


class ActionModule(AgentAction):
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        plan, fleet = self._task.args.get("plan") or {}, self._task.args.get("fleet") or {}
        store = f"{plan.get('base') or ''}/store"
        table = fleet.get("blobs") or {}
        if any(sha not in table for sha in plan.get("blobs") or []):
            raise AnsibleError("edgekit_blobs: the plan names a blob the fleet's table lacks")
        blobs = self._blobs([table[sha] for sha in plan.get("blobs") or []])
        release = None if (plan.get("state") or {}).get("has_release") else \
            {"base": plan.get("base"), "id": plan.get("release"), "files": plan.get("files")}
        if not store.startswith("/"):
            raise AnsibleError(f"edgekit_blobs: store {store!r} is not an absolute path")
        check = bool(self._task.check_mode)
        self.agent = self._agent(str(plan["base"]), fleet["agent"])
        listing = self._run([*self.agent, "inventory", *([] if check else ["--create"]), store, *blobs])
        try:
            inv = json.loads((listing.get("stdout") or "").strip().splitlines()[-1])
        except (ValueError, IndexError):
            inv = None
        if listing.get("rc") != 0 or not isinstance(inv, dict):
            return {**result, "failed": True, "msg": f"Cannot prepare the store {store}: {self._why(listing)}."}
        have: dict[str, bool] = {str(k): bool(v) for k, v in (inv.get("have") or {}).items()}
        parts: dict[str, int] = {str(k): int(v) for k, v in (inv.get("parts") or {}).items()}
        state = plan.get("state") or {}
        if not check and have and state.get("current") != plan.get("release"):
            rechecked = self._recheck(str(plan["base"]), str(plan.get("release")), store, have)
            if rechecked.get("failed"):
                return {**result, **rechecked}
            result.update(rechecked)
            if rechecked.get("release_dropped"):  # made from a bad copy: made again below
                release = {"base": plan.get("base"), "id": plan.get("release"), "files": plan.get("files")}
        free = inv.get("free_bytes")
        free_kb: int | None = int(free) // 1024 if isinstance(free, int) else None
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
        create = self._create_argv(release)
        result["release_created"] = False
        if check:
            return result
        if not result["changed"]:
            return self._create(result, create) if create else result
        site = plan.get("site") or {}
        if missing and site.get("sources") and site.get("staging"):  # the site's boards first; the rest below
            result["site"] = self._site_pull(store, site, blobs, missing)
            still = set(result["site"].get("missing") or [])
            result["pulled_blobs"] = len(missing) - len(still)
            result["pulled_bytes"] = result["site"].get("bytes", 0)
            missing = [s for s in missing if s in still]
        for sha in relink:  # same content, now needed executable (edgekit's push does the same)
            self._run(["chmod", "0755", "--", f"{store}/{sha}"])
        for sha in missing:
            src = blobs[sha]["src"]
            if not os.path.isfile(src) or os.path.getsize(src) != blobs[sha]["size"]:
                size = blobs[sha]["size"]
                return {**result, "failed": True, "msg": f"The local file {src} for blob {sha[:12]} is missing "
                                                         f"or not {size} bytes; rebuild the artifact."}
        placed: list[str] = []
        for sha in missing:
            if blobs[sha]["size"] > SMALL_BLOB:  # resumed from what an earlier, cut push left
                failed = self._receive(store, sha, blobs[sha], parts.get(sha, 0))
                if failed:
                    return {**result, "failed": True, "msg": failed, "sent_blobs": len(placed),
                            "sent_bytes": sum(blobs[s]["size"] for s in placed)}
                placed.append(sha)
        batches = self._batches([s for s in missing if blobs[s]["size"] <= SMALL_BLOB], blobs)
        for batch in batches[:-1]:  # placed as they come: a later cut keeps them
            got = self._place(result, store, blobs, batch, [], self._tar(batch, blobs))
            if got.get("failed"):
                return got
            placed += batch
        # The last tar stream, the check of every large upload and the release in one command.
        rest = [s for s in missing if s not in placed]
        got = self._place(result, store, blobs, rest, create, self._tar(batches[-1], blobs) if batches else None)
        if not got.get("failed"):
            got["sent_blobs"] = len(placed) + got["sent_blobs"]
            got["sent_bytes"] = sum(blobs[s]["size"] for s in placed) + got["sent_bytes"]
        return got

    def _receive(self, store: str, sha: str, blob: dict[str, Any], offset: int) -> str | None:
        """One large blob through the agent's `receive`, in pieces from ``offset`` (what a cut push left in its
        .part); the piece with the last byte hashes the whole part and places it. None, or why it failed."""
        size = blob["size"]
        start = offset = offset if offset <= size else 0
        with open(blob["src"], "rb") as src:
            while True:
                upto = min(offset + PIECE, size)
                src.seek(offset)
                argv = [*self.agent, "receive", store, sha, str(size), str(offset), "--upto", str(upto)]
                res = self._run([*argv, *(["--executable"] if blob["executable"] else [])], src.read(upto - offset))
                try:
                    word = json.loads((res.get("stdout") or "").strip().splitlines()[-1])["result"]
                except (ValueError, IndexError, KeyError, TypeError):
                    word = None
                name = os.path.basename(blob["src"])
                if res.get("rc") != 0 or word is None:
                    return (f"Uploading {name} failed ({self._why(res)}); run the rollout again to resume where it "
                            "stopped.")
                if word == "partial":
                    offset = upto
                    continue
                if word == "ok":
                    return None
                if start > 0:  # the resumed prefix was bad (another writer, a crash): send it all again
                    start = offset = 0
                    continue
                self._run(["rm", "-f", "--", f"{store}/{sha}.part"])
                return f"{name} arrived with sha256 {str(word)[:16]}…, not {sha[:16]}…; the upload was deleted."

    def _recheck(self, base: str, release: str, store: str, have: dict[str, bool]) -> dict[str, Any]:
        """The blobs the board has, hashed again before a release is activated from them (the agent's `check`: a
        full sha256, since size and mtime do not change when a disk rots); a bad copy is deleted there and dropped
        from ``have``, so it is sent as if missing."""
        res = self._run([*self.agent, "check", "--release", f"{base}/releases/{release}", store, *have])
        try:
            got = json.loads((res.get("stdout") or "").strip().splitlines()[-1])
        except (ValueError, IndexError):
            got = None
        if res.get("rc") != 0 or not isinstance(got, dict):
            return {"failed": True, "msg": f"Hashing the stored blobs in {store} again failed: {self._why(res)}."}
        for sha in got.get("bad") or []:
            have.pop(sha, None)
        return {"rechecked_bytes": int(got.get("bytes") or 0), "corrupt_blobs": len(got.get("bad") or []),
                "release_dropped": bool(got.get("release_dropped"))}

    def _site_pull(self, store: str, site: dict[str, Any], blobs: dict[str, Any],
                   missing: list[str]) -> dict[str, Any]:
        """edgekit's agent/site_pull.py on the board (aria2c from ``site.sources`` in order, each blob checked by
        the board's own sha256; the spec on stdin); never fails the task: what it lacks after, the caller sends.
        Per board: bytes and blobs taken, from which source, what is still missing, copies rejected."""
        spec = {"store": store, "staging": str(site["staging"]), "sources": list(site["sources"]),
                "blobs": [{"sha256": s, "size": blobs[s]["size"], "executable": blobs[s]["executable"]}
                          for s in missing]}
        res = self._run([*self.agent, "site-pull", "-"], json.dumps(spec).encode())
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
        """A tar of `<sha>.part` members (mode 0600; the agent's `place` gives each its final mode)."""
        buf = io.BytesIO()
        now = int(time.time())
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for sha in shas:
                info = tarfile.TarInfo(f"{sha}.part")
                info.size, info.mode, info.mtime = blobs[sha]["size"], 0o600, now
                with open(blobs[sha]["src"], "rb") as fh:
                    tar.addfile(info, fh)
        return buf.getvalue()

    def _create_argv(self, release: Any) -> list[str]:
        """The agent's `release-create BASE ID [PATH SHA]...` for ``release``, or [] without one."""
        if not release:
            return []
        files = [str(f) for f in release.get("files") or []]
        if not str(release.get("base", "")).startswith("/") or not release.get("id") or len(files) % 2:
            raise AnsibleError(f"edgekit_blobs: release needs an absolute base, an id and path/sha256 pairs, "
                               f"not {release!r}")
        return [*self.agent, "release-create", str(release["base"]), str(release["id"]), *files]

    def _create(self, result: dict[str, Any], argv: list[str]) -> dict[str, Any]:
        made = self._run(argv)
        if made.get("rc") != 0:
            return {**result, "failed": True, "msg": f"Making the release directory failed: {self._why(made)}."}
        created = (made.get("stdout") or "").strip().endswith("created")
        return {**result, "release_created": created, "changed": result["changed"] or created}

    def _place(self, result: dict[str, Any], store: str, blobs: dict[str, Any], shas: list[str],
               create: list[str], tar: bytes | None = None) -> dict[str, Any]:
        """The agent's `place`: unpack ``tar`` (uploads) into the store, hash the uploads ``shas`` on the board,
        rename the good ones into place and delete the bad ones; then, with every one good, make the release
        (``create``) in the same command."""
        argv = [*self.agent, "place", *(["--tar"] if tar is not None else []), store]
        for sha in shas:
            argv += [sha, "0755" if blobs[sha]["executable"] else "0644"]
        if create:
            argv += ["--", *create]
        placed = self._run(argv, tar)
        lines = (placed.get("stdout") or "").strip().splitlines()
        try:
            got = json.loads(lines[0])
        except (ValueError, IndexError):
            got = None
        if placed.get("rc") != 0 or not isinstance(got, dict):
            what = "Verifying the uploads or making the release" if create else "Verifying the uploads"
            return {**result, "failed": True, "msg": f"{what} in {store} failed: {self._why(placed)}."}
        good, bad = set(got.get("placed") or []), dict(got.get("bad") or {})
        result["sent_blobs"] = len(good)
        result["sent_bytes"] = sum(blobs[s]["size"] for s in good)
        unsettled = [s for s in shas if s not in good]
        if unsettled:
            sha = unsettled[0]
            name = os.path.basename(blobs[sha]["src"])
            return {**result, "failed": True, "msg": f"{name} arrived with sha256 {bad.get(sha, 'missing')[:16]}…, "
                                                     f"not {sha[:16]}…; the upload was deleted."}
        if create:
            result["release_created"] = lines[-1].strip().endswith("created")
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
