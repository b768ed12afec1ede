"""ForkWaitlist: the samples of an `n > 1` request that wait for their parent's prompt.

    parent  [prompt .............]--prefill-->[first token]  -> fork: each sample takes a
    sample 1 waits here ------------------------------------^     reference on the parent's
    sample 2 waits here ------------------------------------^     full prompt blocks

The first sample (the parent) prefills the prompt once; the others wait here until it
samples its first token, then share its full prompt blocks by reference count and compute
only the prompt's partial last block. A parent that ends before that hands its waiting
samples to the first of them, which then prefills in its place.
"""
from __future__ import annotations

from engine.request import Request


class ForkWaitlist:
    """Samples waiting for a parent, by the parent's request id."""

    def __init__(self):
        self._children: dict[str, list[Request]] = {}
        self._parent_of: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._parent_of)

    def wait_for(self, parent: Request, child: Request) -> None:
        self._children.setdefault(parent.request_id, []).append(child)
        self._parent_of[child.request_id] = parent.request_id

    def take(self, parent: Request) -> list[Request]:
        """The samples waiting for `parent` (now ready to fork), in arrival order."""
        children = self._children.pop(parent.request_id, [])
        for child in children:
            del self._parent_of[child.request_id]
        return children

    def discard(self, child: Request) -> bool:
        """Forget a waiting sample (it was aborted); False if it was not waiting here."""
        parent_id = self._parent_of.pop(child.request_id, None)
        if parent_id is None:
            return False
        self._children[parent_id].remove(child)
        if not self._children[parent_id]:
            del self._children[parent_id]
        return True

    def orphan(self, parent: Request) -> Request | None:
        """The parent ended before its first token: its first waiting sample becomes the
        new parent of the others. Returns that heir (None if none waited)."""
        children = self.take(parent)
        if not children:
            return None
        heir = children[0]
        for child in children[1:]:
            self.wait_for(heir, child)
        return heir
