"""Offline HTML rendering for the frontend task: Debian's Chromium driven by Playwright. Imports
no JAX.

The official evaluator renders with Selenium and headless Firefox, and it loads Tailwind and the picsum images from
the network. This renderer is fully offline:

- Tailwind 2.2.19 is served from a local copy of the npm package's `dist/tailwind.min.css`. `launch/setup.sh` puts
  it in `~/.cache/sweet_jax/`; `SWEET_JAX_TAILWIND_CSS` overrides the path.
- Every picsum.photos image is a local placeholder: a flat grey PNG of the requested width and height.
- Every other request is blocked.

Screenshots are full-page, at a fixed 1366 x 768 viewport (headless Firefox's default window size), with animations
disabled. The same HTML gives byte-identical PNGs. One browser and one page are reused. They live on a thread of
their own, since Playwright's sync API is bound to the thread that started it, so `render` may be called from any
thread, including from asyncio code through `run_in_executor`.

    with Renderer() as r:
        png_path = r.render(html, "page.png")    # None if the page could not be rendered

A page that cannot be loaded or captured is logged and gives None (the official code's failure). A Chromium that
died raises RendererUnavailable: every later page would fail too, and scoring them as blank would be silent.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import logging
import os
import re
import shutil
import struct
import zlib

from sweet_jax.files.atomic import atomic_file
from sweet_jax.files.cache import cache_path

log = logging.getLogger("sweet_jax.colbench.render")

TAILWIND_VERSION = "2.2.19"
# sha256 of the npm package's dist/tailwind.min.css: the renderer checks its copy; launch/setup.sh reads it here
TAILWIND_SHA256 = "b6ad97402eddb903e7a5d7a73ee47a679204efbdda4521a391cbad9df509b932"
VIEWPORT = (1366, 768)
PLACEHOLDER_RGB = (160, 160, 160)
_PICSUM_SIZE = re.compile(r"picsum\.photos/(?:id/\d+/)?(\d+)/(\d+)")


class RendererUnavailable(RuntimeError):
    """No Chromium or no local Tailwind: the message says how to install them."""


def default_tailwind_css() -> str:
    return os.environ.get("SWEET_JAX_TAILWIND_CSS") or cache_path(f"tailwind-{TAILWIND_VERSION}.min.css")


def find_chromium() -> str | None:
    explicit = os.environ.get("SWEET_JAX_CHROMIUM")
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def solid_png(width: int, height: int, rgb=PLACEHOLDER_RGB) -> bytes:
    """A flat-colour RGB PNG (no imaging library needed)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(row * height, 9)) + chunk(b"IEND", b""))


class Renderer:
    def __init__(self, chromium: str | None = None, tailwind_css: str | None = None, viewport=VIEWPORT,
                 timeout_s: float = 30.0):
        self.chromium = chromium or find_chromium()
        if not self.chromium or not os.path.exists(self.chromium):
            raise RendererUnavailable("Chromium not found: install Debian's `chromium` (apt-get install chromium; "
                                      "launch/setup.sh does) or set SWEET_JAX_CHROMIUM to its path")
        css_path = tailwind_css or default_tailwind_css()
        if not os.path.exists(css_path):
            raise RendererUnavailable(f"Tailwind {TAILWIND_VERSION} CSS not found at {css_path}: run "
                                      f"`bash launch/setup.sh`, or set SWEET_JAX_TAILWIND_CSS")
        with open(css_path, "rb") as fh:
            self.css = fh.read()
        if hashlib.sha256(self.css).hexdigest() != TAILWIND_SHA256:
            raise RendererUnavailable(f"{css_path}: not Tailwind {TAILWIND_VERSION}'s dist/tailwind.min.css (sha256 "
                                      f"differs); delete it and run `bash launch/setup.sh`")
        self.viewport = viewport
        self.timeout_ms = timeout_s * 1000
        self._images: dict[tuple[int, int], bytes] = {}
        self._thread = cf.ThreadPoolExecutor(1, thread_name_prefix="renderer")
        self._thread.submit(self._start).result()

    # Everything below runs on the renderer's own thread.
    def _start(self) -> None:
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium refuses its sandbox as root
        self._browser = self._pw.chromium.launch(executable_path=self.chromium, args=args + [
            "--disable-gpu", "--font-render-hinting=none", "--hide-scrollbars"])
        self._page = self._browser.new_page(viewport={"width": self.viewport[0], "height": self.viewport[1]},
                                            device_scale_factor=1)
        self._page.route("**/*", self._route)

    def _route(self, route) -> None:
        url = route.request.url
        if url.startswith("data:") or url == "about:blank":
            return route.continue_()
        if "tailwind" in url and url.endswith(".css"):
            return route.fulfill(body=self.css, content_type="text/css")
        if "picsum.photos" in url:
            m = _PICSUM_SIZE.search(url)
            size = (min(int(m.group(1)), 4096), min(int(m.group(2)), 4096)) if m else (200, 200)
            if size not in self._images:
                self._images[size] = solid_png(max(size[0], 1), max(size[1], 1))
            return route.fulfill(body=self._images[size], content_type="image/png")
        return route.abort()

    def _render(self, html: str, out_path: str) -> str | None:
        try:
            self._page.set_content(html, wait_until="load", timeout=self.timeout_ms)
            png = self._page.screenshot(full_page=True, animations="disabled", caret="hide",
                                        timeout=self.timeout_ms)
        except Exception as e:  # noqa: BLE001 - playwright raises its own Error and TimeoutError
            if not self._browser.is_connected():  # Chromium itself died: no page can be scored from here on
                log.error("Chromium (%s) died while rendering %s: %s", self.chromium, out_path, e)
                raise RendererUnavailable(f"Chromium ({self.chromium}) died while rendering {out_path}: {e}") from e
            # a page that cannot be loaded or captured: no render, as the official code's failure
            log.warning("page not rendered (%s): %s", out_path, str(e).splitlines()[0] if str(e) else type(e).__name__)
            return None
        with atomic_file(out_path, "wb") as fh:
            fh.write(png)
        return out_path

    def _stop(self) -> None:
        if self._browser.is_connected():
            self._browser.close()
        self._pw.stop()

    # The public side.
    def render(self, html: str, out_path: str) -> str | None:
        """Screenshot `html` to the PNG `out_path`; returns the path, or None when the page could not be rendered."""
        return self._thread.submit(self._render, html, out_path).result()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.submit(self._stop).result()
            self._thread.shutdown()
            self._thread = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
