#!/usr/bin/env bash
# Build abl's wheel, install it non-editable into a fresh venv, and use it from a
# folder outside the source tree: a 2-cell grid from the packaged ablations,
# abl report, and abl dashboard with pages fetched over HTTP.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
out="$src/build/wheel-smoke"
rm -rf "$out" && mkdir -p "$out/dist"
.venv/bin/pip wheel -q --no-deps --no-build-isolation -w "$out/dist" . 2>&1 | grep -v "^WARNING: Location" || true
wheel=$(ls "$out"/dist/abl-*.whl)
python3 -m venv "$out/venv"
"$out/venv/bin/pip" install -q torch==2.13.0 "${wheel}[dashboard]" 2>&1 | grep -v "^WARNING: Location" || true
abl="$out/venv/bin/abl"
work="$out/work" && mkdir -p "$work" && cd "$work"   # nothing here can import the source tree
"$out/venv/bin/python" - <<'PY'
import abl, abl.plugins, abl.dashboard, abl.ablations
for mod in (abl, abl.plugins, abl.dashboard):
    assert "site-packages" in mod.__file__, f"{mod.__name__} imported from {mod.__file__}, not the wheel"
print("wheel imports:", abl.__file__)
PY
"$abl" run ablations/norms.toml --db "$work/abl.duckdb" \
    --set 'grid.model.norm=["rmsnorm", "layernorm"]' --set 'grid.model.block=["pre"]' \
    --set 'experiment.seeds=[0]' --set train.steps=8 --set train.eval_every=4 --set train.eval_batches=2 \
    --set train.batch_size=4 --set model.context=32
n=$("$out/venv/bin/python" -c "import duckdb; print(duckdb.connect('$work/abl.duckdb', read_only=True).execute(\"SELECT count(*) FROM runs WHERE status = 'completed'\").fetchone()[0])")
[ "$n" = 2 ] || { echo "wheel smoke: expected 2 completed runs, found $n" >&2; exit 1; }
"$abl" report norms --db "$work/abl.duckdb" --out "$work/report"
ls "$work"/report/* >/dev/null
port=8597
"$abl" dashboard --db "$work/abl.duckdb" --port "$port" > "$work/dashboard.log" 2>&1 &
dash=$!
trap 'kill $dash 2>/dev/null || true' EXIT
"$out/venv/bin/python" - "$port" <<'PY'
import sys, time, urllib.request
port = sys.argv[1]
deadline = time.time() + 90
while True:
    try:
        health = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5).read().decode()
        break
    except OSError:
        if time.time() > deadline:
            raise SystemExit("wheel smoke: the dashboard did not answer within 90 s")
        time.sleep(1)
page = urllib.request.urlopen(f"http://127.0.0.1:{port}/curves", timeout=10).read().decode()
assert health.strip() == "ok", health
assert "<html" in page.lower(), page[:200]
print("dashboard answered over HTTP:", health.strip(), f"/curves {len(page)} bytes")
PY
# the installed app itself, run headless by Streamlit's AppTest: every page renders without an exception
ABL_DB="$work/abl.duckdb" "$out/venv/bin/python" - <<'PY'
from pathlib import Path
from streamlit.testing.v1 import AppTest
import abl.dashboard
app = Path(abl.dashboard.__file__).parent / "app.py"
at = AppTest.from_file(str(app), default_timeout=120).run()
assert not at.exception, [e.message for e in at.exception]
assert not at.error, [e.value for e in at.error]
experiments = at.dataframe[0].value
assert list(experiments["experiment"]) == ["norms"], experiments
print("installed app rendered: the Experiments page lists", list(experiments["experiment"]))
PY
echo "wheel smoke: ok"
