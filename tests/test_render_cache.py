"""The render cache of ranked HTML candidates: every distinct page rendered once, ever (in one call, across calls and
across processes on the same directory), in parallel, and a page that fails or is missing scored as the official
"no answer" image."""

import hashlib
import threading
import time

from PIL import Image

from system import needs_renderer

from sweet_jax.colbench.render import Renderer, solid_png
from sweet_jax.colbench.render_cache import RenderCache

STUCK = '<html><body><script>while (true) {}</script></body></html>'  # never finishes loading


class CountingRenderer:
    """Records every page it is asked to render; "FAIL" pages give None, as a page Chromium cannot load."""

    log: list = []
    lock = threading.Lock()
    live = 0
    most_live = 0

    def __init__(self):
        self.closed = False

    def render(self, html, out_path):
        cls = CountingRenderer
        with cls.lock:
            cls.log.append(html)
            cls.live += 1
            cls.most_live = max(cls.most_live, cls.live)
        time.sleep(0.05)
        with cls.lock:
            cls.live -= 1
        if "FAIL" in html:
            return None
        with open(out_path, "wb") as fh:
            fh.write(solid_png(4, 4, (len(html) % 256, 0, 0)))
        return out_path

    def close(self):
        self.closed = True


def _reset():
    CountingRenderer.log, CountingRenderer.live, CountingRenderer.most_live = [], 0, 0


def test_no_page_is_rendered_twice_in_a_call_across_calls_or_after_a_restart(tmp_path):
    _reset()
    pages = [f"<html>page {i % 5}</html>" for i in range(16)] + [None, "<html>FAIL</html>", "<html>FAIL</html>"]
    with RenderCache(str(tmp_path), workers=3, renderer_factory=CountingRenderer) as cache:
        first = cache.screenshots(pages)
        assert sorted(CountingRenderer.log) == sorted({p for p in pages if p})  # 5 pages and the failing one, once
        assert cache.renders == 6 and CountingRenderer.most_live > 1  # rendered side by side
        assert cache.screenshots(pages) == first and cache.screenshot("<html>FAIL</html>") == cache.no_answer
    assert len(CountingRenderer.log) == 6
    again = RenderCache(str(tmp_path), workers=3, renderer_factory=CountingRenderer)  # a resumed job
    assert again.screenshots(list(reversed(pages))) == list(reversed(first)) and again.renders == 0
    assert len(CountingRenderer.log) == 6
    # the same page always maps to the same file; a missing page and a failed one to the black no-answer image
    assert first[0] == first[5] == first[10] and len(set(first[:5])) == 5
    assert first[16] == first[17] == first[18] == cache.no_answer
    with Image.open(cache.no_answer) as im:
        assert im.size == (224, 224) and im.convert("RGB").getextrema() == ((0, 0), (0, 0), (0, 0))


def test_renderers_start_only_when_needed_and_close_with_the_cache(tmp_path):
    made = []

    def factory():
        made.append(CountingRenderer())
        return made[-1]

    cache = RenderCache(str(tmp_path), workers=4, renderer_factory=factory)
    assert cache.screenshots([None, None]) == [cache.no_answer] * 2 and not made
    cache.screenshots(["<html>a</html>"])
    assert len(made) == 1  # one page: one renderer, however many workers are allowed
    cache.close()
    assert all(r.closed for r in made)


@needs_renderer
def test_chromium_pages_in_parallel_equal_one_renderer_and_a_stuck_page_is_no_answer(tmp_path):
    pages = [f'<html><body class="bg-{c}-500"><h1 class="text-4xl">{c}</h1></body></html>'
             for c in ("red", "green", "blue")]
    with RenderCache(str(tmp_path / "cache"), workers=2,
                     renderer_factory=lambda: Renderer(timeout_s=2.0)) as cache:
        got = cache.screenshots(pages + [STUCK] + pages[::-1])
        assert cache.renders == 4
        assert got[3] == cache.no_answer and got[:3] == got[4:][::-1]
    with Renderer() as one:
        for page, path in zip(pages, got):
            alone = one.render(page, str(tmp_path / "alone.png"))
            assert hashlib.sha256(open(alone, "rb").read()).digest() == hashlib.sha256(open(path, "rb").read()).digest()


def test_threads_asking_for_the_same_pages_at_once_render_each_once(tmp_path):
    _reset()
    pages = [f"<html>{i % 4}</html>" for i in range(8)]
    with RenderCache(str(tmp_path), workers=2, renderer_factory=CountingRenderer) as cache:
        threads = [threading.Thread(target=cache.screenshots, args=(pages[k:] + pages[:k],)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(CountingRenderer.log) == sorted(set(pages)) and cache.renders == 4
        assert cache.render("<html>FAIL</html>") is None and cache.render(pages[0]) == cache.screenshot(pages[0])
