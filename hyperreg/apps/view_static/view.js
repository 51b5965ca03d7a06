// hyperreg view: the λ explorer page. Two modes:
// - live (served by `hyperreg view`): every λ is registered by the server on request
//   (/api/result, /api/volume), the curves fill from its background sweep (/api/curves);
// - embedded (`hyperreg sweep --html`): window.HYPERREG_EMBEDDED holds the swept λ, their
//   numbers and their volumes (base64 NIfTI), and the slider steps through them.
// NiiVue (global `niivue`, loaded before this file) draws the volumes.
(function () {
  "use strict";
  const E = window.HYPERREG_EMBEDDED || null;
  const token = new URLSearchParams(window.location.search).get("token") || "";
  const $ = (id) => document.getElementById(id);
  const state = { info: null, lam: null, refined: false, preview: false, points: [], busy: 0,
    shown: null };
  let nv = null;
  let resultSeq = 0;
  let viewSeq = 0;
  let timer = null;
  let firstResult = null; // the first λ's answer, asked for early
  window.hyperregView = state; // read by the browser tests

  function setBusy(delta) {
    state.busy += delta;
    document.body.dataset.busy = state.busy > 0 ? "1" : "0";
  }

  function status(text, error) {
    const el = $("status");
    el.textContent = text;
    el.className = error ? "error" : "";
  }

  async function api(path, params, method) {
    const query = new URLSearchParams(Object.assign({}, params || {}, { token: token }));
    const response = await fetch("/api/" + path + "?" + query.toString(), {
      method: method || "GET",
    });
    if (!response.ok) {
      let text = response.status + " " + response.statusText;
      try { text = (await response.json()).error || text; } catch (e) { /* not JSON */ }
      throw new Error(text);
    }
    return path === "volume" ? response.arrayBuffer() : response.json();
  }

  function fromBase64(text) {
    const raw = atob(text);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return bytes.buffer;
  }

  function gridIndex(lam) {
    let best = 0;
    state.info.grid.forEach((v, i) => {
      if (Math.abs(v - lam) < Math.abs(state.info.grid[best] - lam)) best = i;
    });
    return best;
  }

  async function volume(kind) {
    if (E) {
      const found = E.volumes[kind];
      if (found === undefined) throw new Error("this page holds no '" + kind + "' volume");
      return fromBase64(Array.isArray(found) ? found[gridIndex(state.lam)] : found);
    }
    const params = { kind: kind };
    if (!["fixed", "moving", "edges"].includes(kind)) {
      params.lam = state.lam;
      params.refined = state.refined ? "1" : "0";
      params.preview = state.preview ? "1" : "0";
    }
    const key = JSON.stringify(params);
    const early = prefetched[key];
    delete prefetched[key];
    return early || api("volume", params);
  }

  // ---- the live page's first answers, asked for before NiiVue has loaded (the server
  // registers the first λ while the browser compiles NiiVue and starts WebGL)
  const prefetched = {};
  const slid = (lam) => Number((Math.round(lam * 100) / 100).toFixed(2)); // the slider's step
  const early = E ? null : api("info").then((info) => {
    const lam = slid(info.lam);
    const result = api("result", { lam: lam, preview: info.preview ? "1" : "0" });
    result.then((r) => {
      const params = { kind: "moved", lam: lam, refined: "0", preview: r.preview ? "1" : "0" };
      prefetched[JSON.stringify(params)] = api("volume", params);
    }, () => {});
    return { info: info, lam: lam, result: result };
  });
  early && early.catch(() => {}); // main() reports a failure

  const LOOKS = {
    fixed: { colormap: "gray", opacity: 1, cal: [0, 255] },
    moving: { colormap: "gray", opacity: 1, cal: [0, 255] },
    moved: { colormap: "gray", opacity: 1, cal: [0, 255] },
    checker: { colormap: "gray", opacity: 1, cal: [0, 255] },
    edges: { colormap: "red", opacity: 1, cal: [0.5, 1] },
    diff: { colormap: "hot", opacity: 0.8, cal: [8, 128] },
    jac: { colormap: "cool", opacity: 0.6, cal: [0, 2] },
    fold: { colormap: "red", opacity: 1, cal: [0.5, 1] },
    contours: { colormap: "jet", opacity: 1, cal: [0.5, 3] },
  };

  async function showVolumes() {
    const mine = ++viewSeq;
    const kinds = [$("base").value];
    const overlay = $("overlay").value;
    if (overlay === "jac") kinds.push("jac", "fold");
    else if (overlay !== "none") kinds.push(overlay);
    setBusy(1);
    try {
      const images = [];
      for (const kind of kinds) {
        const look = LOOKS[kind];
        images.push(await niivue.NVImage.loadFromUrl({
          url: await volume(kind),
          name: kind + ".nii",
          colormap: look.colormap,
          opacity: look.opacity,
          cal_min: look.cal[0],
          cal_max: look.cal[1],
        }));
      }
      if (mine !== viewSeq) return; // a newer request replaced this one
      while (nv.volumes.length) nv.removeVolumeByIndex(0);
      images.forEach((image) => nv.addVolume(image));
      state.shown = { lam: state.lam, refined: state.refined, preview: state.preview,
        kinds: kinds };
    } catch (err) {
      status(String(err.message || err), true);
    } finally {
      setBusy(-1);
    }
  }

  function fmt(value, digits) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
  }

  function showNumbers(r) {
    $("rLam").textContent = fmt(r.lam, 3);
    $("rDice").textContent = fmt(r.mean_dice, 4);
    $("rFold").textContent = fmt(r.folding_percent, 3) + " %";
    $("rSdlogj").textContent = fmt(r.log_jacobian_std, 4);
    $("rNcc").textContent = fmt(r.ncc, 4);
    const network = (r.network || "").replace(", no flip averaging", "")
      .replace(", flip averaging", " + flips"); // "2 passes + flips", "1 pass"
    $("rKind").textContent = r.refined ? "refined" : (r.preview ? "preview: " : "network: ") +
      network;
    $("preview").hidden = !r.preview;
    $("preview").textContent = r.preview ? "preview (" + r.network + "); the model's full " +
      "result (" + state.info.network + ") is on its way" : "";
    const rows = Object.entries(r.dice || {}).map(
      ([label, value]) => "<tr><td>label " + label + "</td><td class='v'>" + fmt(value, 3) + "</td></tr>");
    $("perLabel").innerHTML = rows.join("");
    document.body.dataset.lam = String(r.lam);
  }

  async function showResult(r, mine) {
    if (mine !== resultSeq) return false;
    state.preview = Boolean(r.preview);
    showNumbers(r);
    const lam = r.lam.toFixed(E ? 3 : 2);
    if (!E) status("λ = " + lam + ": " + fmt(r.seconds, 2) + " s (" +
      (r.preview ? "preview, " : "network alone, ") + r.network + ")");
    await showVolumes();
    return mine === resultSeq;
  }

  async function showLambda(lam) {
    const mine = ++resultSeq;
    state.lam = lam;
    state.refined = false;
    $("lamText").textContent = "λ = " + lam.toFixed(E ? 3 : 2);
    drawCurves();
    setBusy(1);
    try {
      if (E) {
        await showResult(E.points[gridIndex(lam)], mine);
        return;
      }
      status("registering λ = " + lam.toFixed(2) + " …");
      const asked = firstResult && firstResult.lam === lam ? firstResult.result : null;
      firstResult = null;
      const first = await (asked ||
        api("result", { lam: lam, preview: state.info.preview ? "1" : "0" }));
      if (!(await showResult(first, mine))) return;
      pollCurves();
      if (first.preview) fullResult(lam, mine); // not awaited: the page is usable meanwhile
    } catch (err) {
      if (mine !== resultSeq) return; // a newer λ was asked for (the server dropped this one)
      status(String(err.message || err), true);
    } finally {
      setBusy(-1);
    }
  }

  async function fullResult(lam, mine) { // the model's full passes and flips replace a preview
    setBusy(1);
    try {
      if (await showResult(await api("result", { lam: lam }), mine)) pollCurves(); // its point
    } catch (err) {
      if (mine === resultSeq) status(String(err.message || err), true);
    } finally {
      setBusy(-1);
    }
  }

  // ---- curves against λ (four small plots, the current λ marked)
  const CURVES = [
    ["cDice", "mean Dice", (p) => p.mean_dice],
    ["cNcc", "similarity (local NCC)", (p) => p.ncc],
    ["cSdlogj", "std log J", (p) => p.log_jacobian_std],
    ["cFold", "folding %", (p) => p.folding_percent],
  ];

  function drawCurves() {
    const points = state.points.slice().sort((a, b) => a.lam - b.lam);
    for (const [id, title, get] of CURVES) {
      const canvas = $(id);
      const g = canvas.getContext("2d");
      const w = canvas.width, h = canvas.height, pad = 34;
      g.fillStyle = "#101214";
      g.fillRect(0, 0, w, h);
      g.fillStyle = "#ccc";
      g.font = "20px system-ui, sans-serif";
      g.fillText(title, 8, 22);
      const values = points.map(get).filter((v) => v !== null && v !== undefined);
      const x = (lam) => pad + (w - 2 * pad) * lam;
      if (state.lam !== null) {
        g.strokeStyle = "#ffcc33";
        g.beginPath(); g.moveTo(x(state.lam), 30); g.lineTo(x(state.lam), h - 20); g.stroke();
      }
      g.fillStyle = "#888";
      g.font = "16px system-ui, sans-serif";
      g.fillText("0", pad - 4, h - 4);
      g.fillText("λ", w / 2, h - 4);
      g.fillText("1", w - pad - 4, h - 4);
      if (!values.length) continue;
      let low = Math.min(...values), high = Math.max(...values);
      if (high - low < 1e-9) { low -= 0.5; high += 0.5; }
      const y = (v) => h - 24 - (h - 60) * (v - low) / (high - low);
      g.fillText(high.toPrecision(3), w - 70, 22);
      g.fillText(low.toPrecision(3), w - 70, h - 30);
      g.strokeStyle = "#6cb6ff";
      g.fillStyle = "#6cb6ff";
      g.beginPath();
      let first = true;
      for (const p of points) {
        const v = get(p);
        if (v === null || v === undefined) continue;
        if (first) g.moveTo(x(p.lam), y(v)); else g.lineTo(x(p.lam), y(v));
        first = false;
      }
      g.stroke();
      for (const p of points) {
        const v = get(p);
        if (v !== null && v !== undefined) g.fillRect(x(p.lam) - 3, y(v) - 3, 6, 6);
      }
    }
  }

  let polling = false; // one loop of curve requests, however many λ were shown
  async function pollCurves() {
    if (polling) return;
    polling = true;
    try {
      const curves = await api("curves");
      state.points = curves.points;
      drawCurves();
      if (!curves.done) setTimeout(() => { polling = false; pollCurves(); }, 1500);
      else polling = false;
    } catch (err) {
      polling = false;
      status("curves: " + String(err.message || err), true);
    }
  }

  async function refine() {
    const lam = state.lam;
    const mine = ++resultSeq;
    setBusy(1);
    status("refining λ = " + lam.toFixed(2) + " (" + state.info.refine + ") …");
    try {
      const r = await api("refine", { lam: lam }, "POST");
      if (mine !== resultSeq) return;
      state.refined = true;
      state.preview = false;
      showNumbers(r);
      status("λ = " + lam.toFixed(2) + " refined in " + fmt(r.seconds, 1) + " s");
      await showVolumes();
    } catch (err) {
      if (mine !== resultSeq) return;
      status(String(err.message || err), true);
    } finally {
      setBusy(-1);
    }
  }

  async function save() {
    setBusy(1);
    try {
      const answer = await api("save", { lam: state.lam, refined: state.refined ? "1" : "0" }, "POST");
      status("wrote " + answer.files.join(", "));
    } catch (err) {
      status(String(err.message || err), true);
    } finally {
      setBusy(-1);
    }
  }

  function sliderLambda() {
    const value = Number($("lam").value);
    return E ? state.info.grid[value] : value;
  }

  async function main() {
    setBusy(1);
    try {
      nv = new niivue.Niivue({
        backColor: [0.08, 0.09, 0.1, 1],
        isColorbar: false,
        dragAndDropEnabled: false,
        loadingText: "",
        show3Dcrosshair: false,
      });
      await nv.attachTo("gl");
      const first = E ? null : await early;
      state.info = E ? E.info : first.info;
      const info = state.info;
      $("pair").textContent = info.moving + " → " + info.fixed + " (" + info.ndim + "D)";
      const plane = { axial: nv.sliceTypeAxial, coronal: nv.sliceTypeCoronal,
        sagittal: nv.sliceTypeSagittal };
      nv.setSliceType(info.ndim === 2 ? plane[info.plane] : nv.sliceTypeMultiplanar);
      if (info.ndim === 2) nv.opts.crosshairWidth = 0; // one plane: nothing to link
      const slider = $("lam");
      if (E) {
        slider.min = 0; slider.max = info.grid.length - 1; slider.step = 1;
        slider.value = gridIndex(info.lam);
        state.points = E.points;
        $("actions").style.display = "none";
        for (const select of [$("base"), $("overlay")]) {
          for (const option of Array.from(select.options)) {
            if (option.value !== "none" && !(option.value in E.volumes)) option.remove();
          }
        }
        $("about").textContent = "A page written by hyperreg sweep: the slider steps through " +
          "the swept λ; volumes are stored downsampled and as 8-bit grey levels.";
      } else {
        slider.value = first.lam;
        firstResult = first;
        $("refineText").textContent = "refine: " + info.refine + "; save: " + info.out;
        $("about").textContent = "Each λ is registered by the network alone when you move " +
          "the slider (the pair was prepared once, affine stage included); the curves fill " +
          "from a background sweep." + (info.preview ? " A new λ shows a preview first " +
          "(one network pass, no flip averaging), replaced by the model's full result (" +
          info.network + ") when it is ready; curves, refine and save use the full one." : "");
      }
      if (!info.has_labels) {
        for (const option of Array.from($("overlay").options)) {
          if (option.value === "contours") option.remove();
        }
      }
      slider.addEventListener("input", () => {
        const lam = sliderLambda();
        $("lamText").textContent = "λ = " + lam.toFixed(E ? 3 : 2);
        clearTimeout(timer);
        timer = setTimeout(() => showLambda(lam), E ? 0 : 50); // a drag: its last λ
      });
      $("base").addEventListener("change", showVolumes);
      $("overlay").addEventListener("change", showVolumes);
      $("refine").addEventListener("click", refine);
      $("save").addEventListener("click", save);
      await showLambda(sliderLambda());
      document.body.dataset.ready = "1";
    } catch (err) {
      status(String(err.message || err), true);
    } finally {
      setBusy(-1);
    }
  }

  window.addEventListener("DOMContentLoaded", main);
})();
