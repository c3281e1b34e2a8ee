"""JupyterLab in a real browser: start `jupyter lab` on localhost, open a notebook in headless Chromium (Debian's
chromium + chromedriver, driven by selenium), Run -> Run All Cells, wait for the kernel to finish, and check that
every code cell ran, none raised, and the figures rendered as images. 00_quickstart: its figures and tables;
10_explorer: its widgets render, and moving a slider through the widget's DOM changes the plotted TTFT.

Needs /usr/bin/chromium and /usr/bin/chromedriver (CI installs them: .ci/run); skipped with the reason otherwise.
Installs nothing. The notebook is copied into a temporary root with tiny parameters injected (papermill
--prepare-only), so the run takes well under two minutes.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from npumoe_lab.utils import REPO_ROOT

pytestmark = pytest.mark.browser

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
JUPYTER = Path(sys.executable).parent / "jupyter"
NOTEBOOK = "00_quickstart"
MODEL = os.environ.get("NPUMOE_NOTEBOOK_TEST_MODEL", "tiny")   # another checkpoint folder: test against it
TINY = dict(model=MODEL, prompt_len=256, chunk=128, calib_tokens=1024)
EXPLORER = ("10_explorer", dict(model=MODEL, prompt_len=256, chunk=128, calib_tokens=1024))
RUN_TIMEOUT_S = 240
STDERR = ".jp-OutputArea [data-mime-type='application/vnd.jupyter.stderr']"   # stderr streams and tracebacks


def _requirements_or_skip():
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.skip(f"browser test needs Debian's chromium and chromium-driver ({', '.join(missing)} missing); "
                    "install them with `apt-get install chromium chromium-driver` (.ci/run does)")
    pytest.importorskip("selenium", reason="selenium is not installed in the venv")
    if not JUPYTER.exists():
        pytest.skip(f"jupyter is not installed next to {sys.executable}")
    from npumoe_lab.models import TINY_MODEL_DIR
    if MODEL == "tiny" and not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip(f"the bundled tiny model is not built yet ({TINY_MODEL_DIR})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prepare_root(root: Path, notebook: str, params: dict) -> None:
    """The notebook with the tiny parameters injected (not executed), plus lab settings for a headless run."""
    import papermill
    papermill.execute_notebook(str(REPO_ROOT / "notebooks" / f"{notebook}.ipynb"), str(root / f"{notebook}.ipynb"),
                               parameters=params, prepare_only=True, kernel_name="python3", progress_bar=False)
    settings = root / ".lab" / "settings"
    (settings / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    # every cell in the DOM (no virtual scrolling), no news/update toasts over the menus
    (settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        '{"windowingMode": "none"}')
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}')


@pytest.fixture
def jupyterlab(tmp_path, request):
    """(url of the notebook with the token, the server's root folder, its log); the server is killed afterwards.
    The notebook and its parameters: 00_quickstart with TINY, or (name, params) by indirect parametrization."""
    _requirements_or_skip()
    notebook, params = getattr(request, "param", (NOTEBOOK, TINY))
    root = tmp_path / "root"
    root.mkdir()
    _prepare_root(root, notebook, params)
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, NPUMOE_NO_PROGRESS="1", NPUMOE_CACHE=str(tmp_path / "cache"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    # kernels import this checkout's package whatever their working directory
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    log = tmp_path / "jupyterlab.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [str(JUPYTER), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
             *(["--allow-root"] if os.geteuid() == 0 else []),
             f"--LabApp.user_settings_dir={root / '.lab' / 'settings'}",
             f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
            stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"jupyter lab did not start (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/lab/tree/{notebook}.ipynb?token={token}", root, log
    finally:
        try:  # the server and the kernels it started (its own session)
            os.killpg(proc.pid, 15)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass


@pytest.fixture
def browser(tmp_path):
    _requirements_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1600,1200", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER), log_output=str(tmp_path / "chromedriver.log")),
                              options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)


def _click_menu(driver, wait, menu: str, item: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    wait.until(EC.element_to_be_clickable(
        (By.XPATH, f"//div[contains(@class,'lm-MenuBar-itemLabel') and normalize-space()='{menu}']"))).click()
    wait.until(EC.element_to_be_clickable(
        (By.XPATH, f"//li[contains(@class,'lm-Menu-item')][.//div[contains(@class,'lm-Menu-itemLabel') and "
                   f"normalize-space()='{item}']]"))).click()


def _prompts(driver) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt'))"
        ".map(e => e.textContent.trim());")


def _run_all(browser, url, root, log, notebook, min_cells, screenshot):
    """Open the notebook, Run All Cells, wait until every cell ran (or one raised); returns the prompts. Fails
    naming the traceback or the cells that did not run; saves a screenshot either way."""
    import nbformat
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 90)
    browser.get(url)
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, ".jp-Notebook .jp-CodeCell")))
    # the kernel is up (the toolbar's kernel status) before we run anything
    wait.until(lambda d: d.execute_script(
        "const e = document.querySelector('.jp-Notebook-ExecutionIndicator');"
        "return e && e.getAttribute('data-status') === 'idle';"))
    n_code = sum(c.cell_type == "code" for c in nbformat.read(root / f"{notebook}.ipynb", as_version=4).cells)
    assert n_code >= min_cells
    wait.until(lambda d: len(_prompts(d)) == n_code)   # every cell rendered
    # status bar "Python 3 (ipykernel) | Idle", or (JupyterLab 4.6 has no kernel item in the status bar) the
    # notebook toolbar: a kernel name (not "No Kernel") and "Kernel status: Idle": the session is connected to a
    # kernel that answered
    status_js = ("const q = s => Array.from(document.querySelectorAll(s)).map(e => e.textContent.trim()).join(' ');"
                 "return q('.jp-StatusBar-Widget') + ' || ' + q('.jp-Toolbar-kernelName') + ' | ' "
                 "+ q('.jp-Notebook-ExecutionIndicator-tooltip');")
    try:
        wait.until(lambda d: re.search(r"\| Idle|\|\| (?!No Kernel)\S.* \| Kernel status: Idle",
                                       d.execute_script(status_js)))
    except TimeoutException:
        browser.save_screenshot(str(screenshot))
        html = browser.execute_script("const t = document.querySelector('.jp-NotebookPanel-toolbar');"
                                      "return t ? t.outerHTML.slice(-3000) : 'no toolbar';")
        pytest.fail(f"the kernel never showed idle (status bar and toolbar: {browser.execute_script(status_js)!r}); "
                    f"toolbar: {html}")
    for _ in range(3):  # a Run All issued while the session is still connecting can be lost: then issue it again
        _click_menu(browser, wait, "Run", "Run All Cells")
        try:
            WebDriverWait(browser, 20).until(lambda d: any(p != "[ ]:" for p in _prompts(d)))
            break
        except TimeoutException:
            continue

    deadline, prompts = time.time() + RUN_TIMEOUT_S, []
    while time.time() < deadline:
        prompts = _prompts(browser)
        busy = browser.execute_script(
            "const e = document.querySelector('.jp-Notebook-ExecutionIndicator');"
            "return e ? e.getAttribute('data-status') : 'none';")
        done = all(re.fullmatch(r"\[\d+\]:", p) for p in prompts)
        errors = browser.find_elements(By.CSS_SELECTOR, STDERR)
        if done and busy == "idle":
            break
        if any("Traceback" in e.text for e in errors):
            break
        time.sleep(1)
    browser.save_screenshot(str(screenshot))   # kept in pytest's tmp folder for a look
    _assert_no_traceback(browser)
    assert len(prompts) == n_code and all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), \
        f"not every cell ran within {RUN_TIMEOUT_S}s: prompts {prompts}\nserver log:\n{log.read_text()[-2000:]}"
    return prompts


def _assert_no_traceback(browser):
    from selenium.webdriver.common.by import By
    tracebacks = [e.text[:800] for e in browser.find_elements(By.CSS_SELECTOR, STDERR) if "Traceback" in e.text]
    assert not tracebacks, f"a cell raised in JupyterLab:\n{tracebacks[0]}"


@pytest.mark.slow
def test_quickstart_runs_in_jupyterlab(jupyterlab, browser):
    from selenium.webdriver.common.by import By

    url, root, log = jupyterlab
    _run_all(browser, url, root, log, NOTEBOOK, 8, root.parent / "jupyterlab.png")
    # the figures (prefill bars + popularity heatmap) rendered as images in output areas
    imgs = browser.find_elements(By.CSS_SELECTOR, ".jp-OutputArea .jp-RenderedImage img")
    assert len(imgs) >= 2
    sizes = [browser.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight];", i)
             for i in imgs]
    assert all(w > 100 and h > 100 for w, h in sizes), sizes
    # the parity cell printed its dict and the measured/modeled rows table rendered
    text = browser.find_element(By.CSS_SELECTOR, ".jp-Notebook").text
    assert "'allclose': True" in text and "measured" in text and "modeled" in text


def _ttft(browser) -> str:
    return browser.execute_script("const e = document.querySelector('.npumoe-metrics .npumoe-ttft');"
                                  "return e ? e.textContent : null;")


@pytest.mark.slow
@pytest.mark.parametrize("jupyterlab", [EXPLORER], indirect=True)
def test_explorer_slider_changes_the_plotted_ttft(jupyterlab, browser, tmp_path):
    """10_explorer runs, its widgets render, and pressing ← on the 'capacity tiers' slider handle (3 -> 2) re-plans:
    the TTFT text changes, the slider reads 2, the timeline tab draws, and no cell or callback writes an error."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    url, root, log = jupyterlab
    _run_all(browser, url, root, log, EXPLORER[0], 3, tmp_path / "explorer-ran.png")
    wait = WebDriverWait(browser, 60)
    wait.until(lambda d: _ttft(d) is not None)              # the widget view rendered its metrics
    before = _ttft(browser)
    assert re.fullmatch(r"TTFT [\d.]+ ms", before), before
    src = "const i = document.querySelector('img.npumoe-baselines'); return i && i.naturalWidth > 100 ? i.src : null;"
    wait.until(lambda d: d.execute_script(src))              # the bars vs the baselines (the open tab) drawn
    bars_before = browser.execute_script(src)
    slider = browser.find_element(By.XPATH, "//div[contains(@class,'widget-slider')]"
                                            "[.//label[normalize-space()='capacity tiers']]")
    readout = slider.find_element(By.CSS_SELECTOR, ".widget-readout")
    assert readout.text.strip() == "3"
    handle = slider.find_element(By.CSS_SELECTOR, ".noUi-handle")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", handle)
    handle.click()
    handle.send_keys(Keys.ARROW_LEFT)
    wait.until(lambda d: readout.text.strip() == "2")
    wait.until(lambda d: _ttft(d) != before)                 # the kernel re-planned and rewrote the metrics
    after = _ttft(browser)
    assert re.fullmatch(r"TTFT [\d.]+ ms", after) and after != before, (before, after)
    wait.until(lambda d: d.execute_script(src) not in (None, bars_before))   # and the bar chart was redrawn
    status = browser.find_element(By.CSS_SELECTOR, ".npumoe-status").text
    assert re.search(r"updated in [\d.]+ s", status), status
    # the lazily drawn timeline tab renders for the new plan
    browser.find_element(By.XPATH, "//li[contains(@class,'lm-TabBar-tab')]"
                                   "[.//div[normalize-space()='timeline (modeled)']]").click()
    wait.until(lambda d: d.execute_script(
        "const i = document.querySelector('img.npumoe-timeline'); return i && i.naturalWidth > 100;"))
    browser.save_screenshot(str(tmp_path / "explorer.png"))  # the test artifact: the explorer after the move
    _assert_no_traceback(browser)
    # widget callbacks print their exceptions to stderr outputs (library warnings there are not errors)
    errors = [e.text[:500] for e in browser.find_elements(By.CSS_SELECTOR, STDERR)
              if re.search(r"Error|Exception|Traceback", e.text)]
    assert not errors, errors


# JS: a src change of the baselines image (the kernel's new PNG arrived) stamps t1, its decode (on screen) t2
WATCH = """
window.__npumoe = {t0: null, t1: null, t2: null, src: null};
const seen = () => {
  const s = window.__npumoe, i = document.querySelector('img.npumoe-baselines');
  if (!i || s.t0 === null || s.t1 !== null || i.src === s.src) return;
  s.t1 = performance.now();
  i.decode().then(() => { s.t2 = performance.now(); }, () => { s.t2 = performance.now(); });
};
new MutationObserver(seen).observe(document.querySelector('.jp-Notebook'),
                                   {attributes: true, subtree: true, childList: true, attributeFilter: ['src']});
"""
ARM = ("const s = window.__npumoe; s.src = document.querySelector('img.npumoe-baselines').src; "
       "s.t1 = null; s.t2 = null; s.t0 = performance.now();")
KNOB_MOVES = 12          # ← ← → → ... on 'capacity tiers' (3 -> 2 -> 1 -> 2 -> 3 -> 2 ...): a re-plan each
SANITY_S = 2.0           # a generous bound: the real median goes to bench/explorer_update.py, not into a test


@pytest.mark.slow
@pytest.mark.parametrize("jupyterlab", [EXPLORER], indirect=True)
def test_explorer_knob_moves_timed_end_to_end(jupyterlab, browser, tmp_path):
    """Knob moves timed in the browser, end to end: from the key press on the 'capacity tiers' slider to the
    re-drawn 'vs baselines' figure decoded on screen (performance.now() around a MutationObserver on its image),
    i.e. widget -> kernel (re-plan, op stream, panel redrawn in place) -> new PNG in the page. Prints the median
    (and writes it as JSON to $NPUMOE_BROWSER_TIMING: bench/explorer_update.py --browser reads it); asserts only
    a sanity bound."""
    import json
    import statistics

    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    url, root, log = jupyterlab
    _run_all(browser, url, root, log, EXPLORER[0], 3, tmp_path / "explorer-ran.png")
    wait = WebDriverWait(browser, 60)
    src = "const i = document.querySelector('img.npumoe-baselines'); return i && i.naturalWidth > 100 ? i.src : null;"
    wait.until(lambda d: d.execute_script(src))
    slider = browser.find_element(By.XPATH, "//div[contains(@class,'widget-slider')]"
                                            "[.//label[normalize-space()='capacity tiers']]")
    readout = slider.find_element(By.CSS_SELECTOR, ".widget-readout")
    handle = slider.find_element(By.CSS_SELECTOR, ".noUi-handle")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", handle)
    handle.click()
    browser.execute_script(WATCH)
    value, step, times, arrived = int(readout.text.strip()), -1, [], []
    for _ in range(KNOB_MOVES):
        if not 1 <= value + step <= 3:
            step = -step
        value += step
        browser.execute_script(ARM)
        handle.send_keys(Keys.ARROW_LEFT if step < 0 else Keys.ARROW_RIGHT)
        WebDriverWait(browser, 30).until(lambda d: d.execute_script("return window.__npumoe.t2 !== null;"),
                                         f"the figure did not update after moving 'capacity tiers' to {value}")
        assert readout.text.strip() == str(value)
        t = browser.execute_script("const s = window.__npumoe; return [s.t1 - s.t0, s.t2 - s.t0];")
        times.append(t[1] / 1e3)
        arrived.append(t[0] / 1e3)
    median = statistics.median(times)
    print(f"explorer knob move in the browser (key press -> figure decoded): median {1e3 * median:.0f} ms over "
          f"{len(times)} moves (the new image's src set after {1e3 * statistics.median(arrived):.0f} ms); each: "
          f"{', '.join(f'{1e3 * t:.0f}' for t in times)} ms")
    if os.environ.get("NPUMOE_BROWSER_TIMING"):
        Path(os.environ["NPUMOE_BROWSER_TIMING"]).write_text(json.dumps(
            {"median_s": median, "times_s": times, "moves": len(times), "knob": "capacity tiers",
             "src_set_median_s": statistics.median(arrived)}))
    _assert_no_traceback(browser)
    assert median < SANITY_S, f"median knob move {median:.2f} s in the browser (sanity bound {SANITY_S} s)"
