"""Screenshots of HTML pages by content hash: each distinct page is rendered once, ever. Imports no JAX.

    cache = RenderCache("RUN/bon/renders", workers=2)
    paths = cache.screenshots(pages)     # a PNG path for every page (str, or None for no page)
    cache.close()

- A page's screenshot is `DIR/<sha256 of the HTML>.png`. A page that could not be rendered leaves `DIR/<hash>.failed`
  instead, so it is not tried again either.
- A page that is None (a response with no HTML) or that failed to render gets `DIR/no-answer.png`, the official
  stand-in for a missing answer: a black 224 x 224 image.
- Pages are rendered in parallel on `workers` Chromium renderers (`colbench.render.Renderer`, started on first use),
  each distinct page once, also when many threads ask for it at the same time. Later calls, and later processes on
  the same directory (a resumed job), find the files and render nothing.
- `renders` counts the pages this cache rendered.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import queue
import threading
from collections.abc import Callable, Sequence

from sweet_jax.colbench.render import solid_png
from sweet_jax.colbench.similarity import CLIP_SIZE
from sweet_jax.files.atomic import atomic_file

NO_ANSWER_PNG = "no-answer.png"


def page_hash(html: str) -> str:
    return hashlib.sha256(html.encode("utf-8")).hexdigest()


class RenderCache:
    """`renderer_factory()` gives a renderer (`render(html, out_path) -> out_path or None`, `close()`); the default
    is the offline Chromium `Renderer`."""

    def __init__(self, directory: str, workers: int = 2, renderer_factory: Callable | None = None):
        self.dir = os.path.abspath(directory)
        os.makedirs(self.dir, exist_ok=True)
        self.workers = max(1, workers)
        self._factory = renderer_factory
        self._idle: queue.Queue = queue.Queue()
        self._started: list = []
        self._lock = threading.Lock()  # guards the counts, the renderers started and the pages in flight
        self._starting = threading.Lock()
        self._inflight: dict[str, cf.Future] = {}
        self._pool: cf.ThreadPoolExecutor | None = None
        self.renders = 0
        self.no_answer = os.path.join(self.dir, NO_ANSWER_PNG)
        if not os.path.exists(self.no_answer):
            with atomic_file(self.no_answer, "wb") as fh:
                fh.write(solid_png(CLIP_SIZE, CLIP_SIZE, (0, 0, 0)))

    def _png(self, digest: str) -> str:
        return os.path.join(self.dir, digest + ".png")

    def _failed(self, digest: str) -> str:
        return os.path.join(self.dir, digest + ".failed")

    def lookup(self, html: str | None) -> str | None:
        """The page's screenshot (or the no-answer image) if it is known, else None."""
        if html is None:
            return self.no_answer
        digest = page_hash(html)
        if os.path.exists(self._png(digest)):
            return self._png(digest)
        return self.no_answer if os.path.exists(self._failed(digest)) else None

    def failed(self, html: str) -> bool:
        """Whether the page was tried and could not be rendered."""
        return os.path.exists(self._failed(page_hash(html)))

    def screenshots(self, pages: Sequence[str | None]) -> list[str]:
        """A screenshot path per page, rendering the distinct unknown pages in parallel. Safe to call from many
        threads at once: a page being rendered for one caller is waited for, not rendered again."""
        waits = []
        with self._lock:
            for page in pages:
                if page is None or self.lookup(page) is not None:
                    continue
                digest = page_hash(page)
                if digest not in self._inflight:
                    if self._pool is None:
                        self._pool = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="render-cache")
                    self._inflight[digest] = self._pool.submit(self._render, digest, page)
                waits.append(self._inflight[digest])
        for future in waits:
            future.result()
        return [self.lookup(p) for p in pages]

    def screenshot(self, page: str | None) -> str:
        return self.screenshots([page])[0]

    def render(self, html: str) -> str | None:
        """The page's screenshot, or None when it cannot be rendered (`colbench.env.FrontendEpisode`'s `render`)."""
        path = self.screenshot(html)
        return None if path == self.no_answer else path

    def _render(self, digest: str, html: str) -> None:
        try:
            renderer = self._checkout()
            try:
                ok = renderer.render(html, self._png(digest))
            finally:
                self._idle.put(renderer)
            if not ok:
                with atomic_file(self._failed(digest)) as fh:
                    fh.write("the page could not be rendered\n")
        finally:
            with self._lock:
                self.renders += 1
                del self._inflight[digest]

    def _checkout(self):
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._starting:  # one pool thread per renderer: at most `workers` are ever started
            if len(self._started) < self.workers:
                if self._factory is None:
                    from sweet_jax.colbench.render import Renderer

                    self._factory = Renderer
                renderer = self._factory()
                self._started.append(renderer)
                return renderer
        return self._idle.get()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        for renderer in self._started:
            renderer.close()
        self._started.clear()
        self._idle = queue.Queue()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
