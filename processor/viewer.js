/* polar-process report: the session explorer (processor/viewer.py writes the data this script reads).
   Every value from the data is rendered with textContent or setAttribute, never parsed as HTML; the page loads
   nothing from anywhere. Views: #overview (static HTML), #sessions?filters (the list), #session/<n> (one session). */
(function () {
  "use strict";
  const NS = document.getElementById("svg-ns").namespaceURI; // the SVG namespace, from an <svg> the parser made
  const PAGE = 50; // sessions per page of the list
  const STRIP_FIRST = 4000; // tokens of one strip drawn before a "show all" button

  function readJSON(id) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  // h("tag", {class, text, attr: value, onclick: fn}, ...children): children that are not nodes become text.
  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    setProps(el, props);
    for (const kid of kids) if (kid !== null && kid !== undefined) el.append(kid instanceof Node ? kid : String(kid));
    return el;
  }
  function svg(tag, attrs, ...kids) {
    const el = document.createElementNS(NS, tag);
    setProps(el, attrs);
    for (const kid of kids) if (kid !== null && kid !== undefined) el.append(kid instanceof Node ? kid : String(kid));
    return el;
  }
  function setProps(el, props) {
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") el.textContent = String(v);
      else if (k === "class") el.setAttribute("class", v);
      else if (typeof v === "function") el.addEventListener(k.replace(/^on/, ""), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  const present = (xs) => xs.filter((x) => x !== null && x !== undefined); // Node.append writes null as "null"
  const fmt = (x, digits) => x === null || x === undefined ? "–" :
    (typeof x === "number" ? (Number.isInteger(x) && digits === undefined ? x.toLocaleString("en") :
      x.toFixed(digits === undefined ? 2 : digits)) : String(x));
  const secs = (x) => x === null || x === undefined ? "–" : (x < 10 ? x.toFixed(2) : x.toFixed(1)) + " s";

  const IDX = readJSON("polar-index");
  const views = {
    overview: document.getElementById("view-overview"),
    sessions: document.getElementById("view-sessions"),
    session: document.getElementById("view-session"),
  };
  const tabs = document.querySelectorAll("#tabs a");
  if (!IDX) {
    views.sessions.append(h("p", {text: "This report holds no session data."}));
  }
  const COL = IDX ? Object.fromEntries(IDX.cols.map((c, i) => [c, i])) : {};
  const sessionName = (s) => s === null ? "(no session)" : s;
  const bitsToNames = (bits, names) => names.filter((_, i) => bits & (1 << i));
  // Short labels for the list's flag chips (the full name is each chip's title and in the legend).
  const SHORT = {context_mismatch: "CM", missing_logprobs: "LP", truncated_turn: "TR", aborted_turn: "AB",
    side_chain: "SC", superseded: "SU", constrained_decoding: "CD", oversize: "OV", mixed_weight_versions: "WV",
    compaction: "CP"};
  // What each flag means and what to do about it: each chip's hover text, and the legend above the list.
  const FLAG_HELP = {
    context_mismatch: "the prompt the trainer rebuilds is not the one the model saw (normal mode). " +
      "Run in exact mode (polar-rollout's default; --proxy-set polar_exact=true); polar-export leaves these out.",
    missing_logprobs: "the backend returned no logprobs for a call. Start it with logprobs on " +
      "(vLLM: --logprobs-mode raw_logprobs); verl and prime-rl exports leave these out.",
    truncated_turn: "a turn ended at max_tokens (finish: length). Usually fine; raise the agent's max tokens " +
      "or the context (--max-model-len) if many are cut.",
    aborted_turn: "a turn ended without an end-of-turn token (the client went away, an error). " +
      "See the call's status; train on it only if that is what you want.",
    side_chain: "a second conversation of the session (a title, a router, a sub-agent). " +
      "polar-process --side-chains include|zero|exclude decides its reward.",
    superseded: "a retried call whose answer the agent discarded. Kept apart, trained as its own sequence.",
    constrained_decoding: "a forced tool call or a JSON-schema answer: the logprobs are grammar-masked. " +
      "Expect larger logprob gaps in polar-verify; they are counted apart.",
    oversize: "longer than --max-batch-tokens: written alone in its batch, never cut. " +
      "Raise --max-batch-tokens if your trainer allows.",
    mixed_weight_versions: "its calls were served by more than one weight version (a publish mid-session). " +
      "Off-policy by a version: the importance ratio covers it.",
    compaction: "holds a compaction call: its summary reappears where the conversation's prefix broke. " +
      "polar-process --compaction train|mask decides whether the summary is trained.",
  };
  const helpOf = (f) => f + (FLAG_HELP[f] ? ": " + FLAG_HELP[f] : "");
  const chips = (names) => names.length ? h("span", {class: "chips"}, ...names.map((f) =>
    h("span", {class: "chip chip-" + f, title: helpOf(f)}, SHORT[f] || f))) : "–";

  function show(name) {
    for (const [k, el] of Object.entries(views)) el.hidden = k !== name;
    for (const a of tabs) a.classList.toggle("on", a.dataset.tab === name);
  }

  // ------------------------------------------------------------------------------------------ the session list

  const state = {q: "", flag: "", cause: "", group: "", protocol: "", rewarded: "", rmin: "", rmax: "",
                 sort: "", desc: "0", page: "1"};
  let listBuilt = null; // {body, count, pager, inputs}

  function matches(row) {
    const f = state;
    if (f.q && !sessionName(row[COL.session]).toLowerCase().includes(f.q.toLowerCase())) return false;
    const flags = row[COL.flags], causes = row[COL.causes];
    if (f.flag === "none" ? flags !== 0 : f.flag === "any" ? flags === 0 :
        f.flag && !(flags & (1 << IDX.flags.indexOf(f.flag)))) return false;
    if (f.cause === "none" ? causes !== 0 : f.cause === "any" ? causes === 0 :
        f.cause && !(causes & (1 << IDX.causes.indexOf(f.cause)))) return false;
    if (f.protocol && !(row[COL.protocols] & (1 << IDX.protocols.indexOf(f.protocol)))) return false;
    const g = row[COL.group] < 0 ? "" : IDX.groups[row[COL.group]];
    if (f.group && !g.toLowerCase().includes(f.group.toLowerCase())) return false;
    const r = row[COL.reward];
    if (f.rewarded === "yes" && r === null) return false;
    if (f.rewarded === "no" && r !== null) return false;
    if (f.rmin !== "" && !(r !== null && r >= Number(f.rmin))) return false;
    if (f.rmax !== "" && !(r !== null && r <= Number(f.rmax))) return false;
    return true;
  }

  function sortKey(row, col) {
    if (col === "group") return row[COL.group] < 0 ? null : IDX.groups[row[COL.group]];
    if (col === "session") return sessionName(row[COL.session]);
    if (col === "flags" || col === "protocols") {
      let n = 0, b = row[COL[col]];
      while (b) { n += b & 1; b >>= 1; }
      return n;
    }
    return row[COL[col]];
  }

  function selected() {
    const out = [];
    IDX.rows.forEach((row, i) => { if (matches(row)) out.push(i); });
    if (state.sort) {
      const dir = state.desc === "1" ? -1 : 1;
      const keys = new Map(out.map((i) => [i, sortKey(IDX.rows[i], state.sort)]));
      out.sort((a, b) => {
        const x = keys.get(a), y = keys.get(b);
        if (x === y) return a - b;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * dir;
      });
    }
    return out;
  }

  const LIST_COLS = [["session", "session"], ["group", "group"], ["reward", "reward"], ["advantage", "adv."],
    ["calls", "calls"], ["errors", "errors"], ["sequences", "seqs"], ["merge_ratio", "merge"], ["tokens", "tokens"],
    ["trainable", "trainable"], ["flags", "flags"], ["breaks", "breaks"], ["protocols", "protocols"],
    ["seconds", "duration"]];

  function select(name, label, options) {
    const el = h("select", {name, "aria-label": label},
      ...options.map(([v, t]) => h("option", {value: v, text: t})));
    return el;
  }

  function buildList() {
    const opts = (names) => names.map((n) => [n, n]);
    const inputs = {
      q: h("input", {name: "q", type: "search", placeholder: "session id contains", "aria-label": "session"}),
      flag: select("flag", "flag", [["", "any flags"], ["any", "flagged"], ["none", "no flags"], ...opts(IDX.flags)]),
      cause: select("cause", "break cause", [["", "any breaks"], ["any", "broken"], ["none", "no breaks"],
        ...opts(IDX.causes)]),
      protocol: select("protocol", "protocol", [["", "any protocol"], ...opts(IDX.protocols)]),
      group: h("input", {name: "group", type: "search", placeholder: "group contains", list: "polar-groups",
        "aria-label": "group"}),
      rewarded: select("rewarded", "reward", [["", "any reward"], ["yes", "rewarded"], ["no", "no reward"]]),
      rmin: h("input", {name: "rmin", type: "number", step: "any", placeholder: "reward ≥", "aria-label": "reward ≥"}),
      rmax: h("input", {name: "rmax", type: "number", step: "any", placeholder: "reward ≤", "aria-label": "reward ≤"}),
    };
    const groups = h("datalist", {id: "polar-groups"}, ...IDX.groups.slice(0, 2000).map((g) => h("option", {value: g})));
    for (const [k, el] of Object.entries(inputs)) {
      el.addEventListener("input", () => { state[k] = el.value; state.page = "1"; renderList(true); });
    }
    const head = h("tr", null, ...LIST_COLS.map(([col, label]) => h("th", {
      "data-col": col, class: "sortable", title: "sort by " + label,
      onclick: () => {
        state.desc = state.sort === col && state.desc === "0" ? "1" : "0";
        state.sort = col; state.page = "1"; renderList(true);
      }}, label)));
    const body = h("tbody");
    const count = h("p", {class: "count", id: "session-count"});
    const prev = h("button", {type: "button", "data-page": "prev", onclick: () => turn(-1)}, "‹ previous");
    const next = h("button", {type: "button", "data-page": "next", onclick: () => turn(1)}, "next ›");
    const where = h("span", {class: "page-no"});
    const strips = IDX.strips.left_out || IDX.texts.left_out ? h("p", {class: "notice", id: "strips-left-out"},
      `Token strips of ${fmt(IDX.strips.left_out)} sessions` + (IDX.texts.left_out ? ` and the conversation text ` +
      `of ${fmt(IDX.texts.left_out)} sessions` : "") + ` were left out to keep the page under --report-max-mb ` +
      `${IDX.max_mb} (broken and flagged sessions keep theirs first).`) : null;
    const legend = h("details", {class: "legend", id: "flag-legend"}, h("summary", null, "Flags: ",
      ...IDX.flags.flatMap((f) => [chips([f]), ` ${f}  `]), "(what each means, what to do)"),
      h("dl", null, ...IDX.flags.flatMap((f) => [h("dt", null, chips([f]), " ", f),
        h("dd", null, FLAG_HELP[f] || "")])));
    views.sessions.append(...present([h("h2", null, "Sessions"), strips]), h("form", {class: "filters", onsubmit: (e) => e.preventDefault()},
      ...Object.values(inputs), groups), count, legend,
      h("div", {class: "scroll"}, h("table", {class: "list"}, h("thead", null, head), body)),
      h("p", {class: "pager"}, prev, where, next));
    listBuilt = {body, count, where, prev, next, inputs, head};
  }

  function turn(step) {
    state.page = String(Math.max(1, Number(state.page) + step));
    renderList(true);
  }

  function listRow(i) {
    const row = IDX.rows[i];
    const s = row[COL.session];
    const g = row[COL.group] < 0 ? null : IDX.groups[row[COL.group]];
    const flags = bitsToNames(row[COL.flags], IDX.flags);
    const causes = bitsToNames(row[COL.causes], IDX.causes);
    const cells = [
      h("a", {href: "#session/" + i}, sessionName(s)), g === null ? "–" : g, fmt(row[COL.reward]),
      fmt(row[COL.advantage]), fmt(row[COL.calls]), fmt(row[COL.errors]), fmt(row[COL.sequences]),
      fmt(row[COL.merge_ratio], 2), fmt(row[COL.tokens]), fmt(row[COL.trainable]), chips(flags),
      row[COL.breaks] ? `${row[COL.breaks]} (${causes.join(", ")})` : "–",
      bitsToNames(row[COL.protocols], IDX.protocols).join(", "), secs(row[COL.seconds])];
    const trouble = causes.length || flags.some((f) => f !== "side_chain" && f !== "constrained_decoding");
    const tr = h("tr", {"data-session": s === null ? "" : s, class: trouble ? "marked" : null},
      ...cells.map((c, n) => h("td", {class: LIST_COLS[n][0]}, c)));
    tr.addEventListener("click", (e) => { if (e.target.tagName !== "A") location.hash = "#session/" + i; });
    return tr;
  }

  function renderList(write) {
    if (!listBuilt) buildList();
    const b = listBuilt;
    for (const [k, el] of Object.entries(b.inputs)) if (el.value !== state[k]) el.value = state[k];
    const rows = selected();
    const pages = Math.max(1, Math.ceil(rows.length / PAGE));
    const page = Math.min(pages, Math.max(1, Number(state.page) || 1));
    state.page = String(page);
    const frag = document.createDocumentFragment();
    for (const i of rows.slice((page - 1) * PAGE, page * PAGE)) frag.append(listRow(i));
    b.body.replaceChildren(frag);
    b.count.textContent = `${fmt(rows.length)} of ${fmt(IDX.rows.length)} sessions`;
    b.where.textContent = ` page ${page} of ${pages} `;
    b.prev.disabled = page <= 1;
    b.next.disabled = page >= pages;
    for (const th of b.head.children) {
      th.classList.toggle("asc", th.dataset.col === state.sort && state.desc === "0");
      th.classList.toggle("desc", th.dataset.col === state.sort && state.desc === "1");
    }
    if (write) {
      const q = new URLSearchParams(Object.entries(state).filter(([k, v]) => v && !(k === "page" && v === "1") &&
        !(k === "desc" && v === "0")));
      history.replaceState(null, "", "#sessions" + (q.toString() ? "?" + q : ""));
    }
  }

  // ------------------------------------------------------------------------------------------ one session

  function heat(lp) {
    const p = Math.exp(Math.max(-20, Math.min(0, lp)));
    return `hsl(${Math.round(120 * p)}, 75%, 78%)`;
  }

  function timeline(D) {
    const calls = D.calls;
    const rowH = calls.length > 60 ? 8 : 16, left = 70, width = 1000, top = 6;
    const tmax = Math.max(0.001, ...calls.map((c) => Math.max(c.end || 0, c.first || 0, c.start || 0)));
    const x = (t) => left + (width - left - 10) * t / tmax;
    const height = top + rowH * calls.length + 26;
    const g = svg("svg", {viewBox: `0 0 ${width} ${height}`, class: "timeline", role: "img",
      "aria-label": "calls on a time line"});
    calls.forEach((c, j) => {
      const y = top + j * rowH;
      const label = `call ${j + 1}: ${c.protocol || "?"} ${c.model || "?"}, start +${secs(c.start)}, first byte ` +
        `${c.first === null ? "–" : "+" + secs(c.first)}, end ${c.end === null ? "–" : "+" + secs(c.end)}` +
        (c.finish ? `, ${c.finish}` : "") + (c.error ? `, error: ${c.error}` : "");
      const item = svg("g", {class: c.error ? "call err" : "call", "data-call": j});
      item.append(svg("title", null, label));
      if (rowH >= 12) item.append(svg("text", {x: left - 6, y: y + rowH - 4, "text-anchor": "end"}, `#${j + 1}`));
      if (c.start !== null) {
        const end = c.end === null ? c.start : c.end;
        item.append(svg("rect", {x: x(c.start), y: y + 1, width: Math.max(1.5, x(end) - x(c.start)),
          height: rowH - 3, class: "wait"}));
        if (c.first !== null) {
          item.append(svg("rect", {x: x(c.first), y: y + 1, width: Math.max(1.5, x(end) - x(c.first)),
            height: rowH - 3, class: "stream"}));
        }
        if (c.error) item.append(svg("text", {x: x(end) + 3, y: y + rowH - 4, class: "x"}, "✕ " + c.error.slice(0, 60)));
      }
      g.append(item);
    });
    const axisY = top + rowH * calls.length + 4;
    g.append(svg("line", {x1: left, x2: width - 10, y1: axisY, y2: axisY, class: "axis"}));
    for (const [t, anchor] of [[0, "start"], [tmax / 2, "middle"], [tmax, "end"]]) {
      g.append(svg("text", {x: x(t), y: axisY + 16, "text-anchor": anchor}, "+" + secs(t)));
    }
    return h("figure", {class: "wide"}, h("figcaption", null,
      "Calls on a time line (light: start → end, dark: first byte → end; ✕ an error)"), g);
  }

  function chainsView(D) {
    const byChain = new Map();
    D.seqs.forEach((s, k) => { if (!byChain.has(s.chain)) byChain.set(s.chain, []); byChain.get(s.chain).push(k); });
    const list = h("ol", {class: "chains"});
    let c = 0;
    for (const [chain, ks] of byChain) {
      c++;
      const item = h("li", null, h("strong", null, `chain ${c}`),
        ` (${D.seqs[ks[0]].side ? "side chain" : "main"}; first call ${chain}) `);
      ks.forEach((k, n) => {
        const s = D.seqs[k];
        const br = D.breaks.find((b) => b.seq === k);
        if (br) {
          const from = br.cause === "prefix_diverged" && br.chain !== s.chain ? " (left another chain)" : "";
          item.append(h("span", {class: "brk"}, ` ── ${br.cause} at token ${fmt(br.pos)}${from} ──▶ `));
        } else if (n) item.append(" · ");
        item.append(h("a", {class: "seqref", href: "#session/" + current, onclick: (e) => {
          e.preventDefault(); document.querySelector(`[data-seq-index="${k}"]`).scrollIntoView();
        }}, `sequence ${k + 1}: ${s.calls.length} call${s.calls.length === 1 ? "" : "s"}, ${fmt(s.n)} tokens` +
          (s.flags.length ? ` [${s.flags.join(", ")}]` : "")));
      });
      list.append(item);
    }
    return [h("h3", null, "Chains and breaks"), D.seqs.length ? list : h("p", null, "No sequences (no call with token ids).")];
  }

  function tokenText(id, vocab) {
    if (!vocab) return String(id);
    const t = vocab[id];
    if (t === undefined) return `⟨${id}⟩`;
    return t === "" ? "∅" : t.replace(/\n/g, "↵\n");
  }

  function drawStrip(box, seq, st, vocab, limit) {
    box.replaceChildren();
    const marks = new Map();
    for (const [pos, cause, isBreak] of seq.marks) {
      if (!marks.has(pos)) marks.set(pos, []);
      marks.get(pos).push([cause, isBreak]);
    }
    const mark = (p) => {
      for (const [cause, isBreak] of marks.get(p) || []) {
        box.append(h("span", {class: isBreak ? "mark brk" : "mark flag", title: `${cause} at token ${p}`},
          (isBreak ? "⟂ " : "⚑ ") + cause));
      }
    };
    let pos = 0, drawn = 0;
    for (const [start, ids, runs, lps] of st.parts) {
      if (start > pos) box.append(h("span", {class: "gap"}, `… ${fmt(start - pos)} tokens …`));
      let r = 0, left = runs[0], m = 0, li = 0;
      for (let t = 0; t < ids.length; t++) {
        while (left === 0) { r++; left = runs[r]; m ^= 1; }
        left--;
        const p = start + t;
        if (marks.has(p)) mark(p);
        if (drawn >= limit) { if (m) li++; continue; }
        const span = document.createElement("span");
        span.className = vocab ? (m ? "t m1" : "t m0") : (m ? "t id m1" : "t id m0");
        span.textContent = tokenText(ids[t], vocab);
        if (m && lps) {
          const lp = lps[li++] / 1000;
          span.style.backgroundColor = heat(lp);
          span.title = `#${p} id ${ids[t]} logprob ${lp.toFixed(3)}`;
        } else span.title = `#${p} id ${ids[t]}${m ? " (no logprob)" : ""}`;
        box.append(span);
        drawn++;
      }
      pos = start + ids.length;
    }
    if (marks.has(st.n)) mark(st.n);
    if (pos < st.n) box.append(h("span", {class: "gap"}, `… ${fmt(st.n - pos)} tokens …`));
    const total = st.parts.reduce((n, p) => n + p[1].length, 0);
    if (drawn < total) {
      box.append(h("button", {type: "button", class: "more", onclick: () => drawStrip(box, seq, st, vocab, Infinity)},
        `show all ${fmt(total)} shown tokens (${fmt(total - drawn)} more)`));
    }
  }

  let VOCAB;
  function sequencesView(D, strips) {
    if (VOCAB === undefined) VOCAB = readJSON("polar-vocab") || {};
    const out = [h("h3", null, "Sequences"), h("p", {class: "legend"},
      h("span", {class: "t m0"}, "context (mask 0)"), " ", h("span", {class: "t m1", style: null}, "trainable (mask 1)"),
      " coloured by the sampled token's logprob: ", h("span", {class: "t m1 hot"}, "low"), " → ",
      h("span", {class: "t m1 cool"}, "high"), `; ${IDX.context} tokens of context around each trainable span and ` +
      "break, the rest collapsed. ", IDX.vocab ? "Token text from --vocab." : "Token ids (pass --vocab DIR for text).")];
    D.seqs.forEach((s, k) => {
      const head = h("div", {class: "seq-head"}, h("strong", null, `sequence ${k + 1}`),
        ` ${s.side ? "side chain" : "main chain"} · ${s.calls.length} call(s) · ${fmt(s.n)} tokens, ${fmt(s.tr)} ` +
        `trainable · prompt ${fmt(s.pl)} · reward ${fmt(s.reward)} · advantage ${fmt(s.adv)}` +
        (s.cause ? ` · starts after a break: ${s.cause}` : "") + (s.flags.length ? ` · flags: ${s.flags.join(", ")}` : ""),
        h("div", {class: "seq-id"}, `sequence_id ${s.id} · model ${s.model === null ? "–" : s.model}`));
      const box = h("div", {class: "strip"});
      const st = strips ? strips[k] : null;
      if (st) drawStrip(box, s, st, s.vk === null ? null : VOCAB[s.vk], STRIP_FIRST);
      else box.append(h("span", {class: "gap"}, "token strip left out (over --report-max-mb)"));
      out.push(h("div", {class: "seq", "data-sequence": s.id, "data-seq-index": k}, head, box));
    });
    return out;
  }

  function messageView(m) {
    const [role, text, calls] = m;
    return h("div", {class: "msg role-" + role.replace(/[^a-z_]/g, "")}, h("b", null, role),
      text ? h("pre", null, text) : null, ...calls.map(([name, args]) => h("pre", {class: "tool"}, `${name}(${args})`)));
  }

  function callsView(D, T) {
    const head = h("tr", null, ...["#", "protocol", "model", "start", "first byte", "end", "finish", "prompt",
      "completion", "tool calls", "sequence", "error"].map((t) => h("th", null, t)));
    const body = h("tbody");
    D.calls.forEach((c, j) => {
      body.append(h("tr", {class: c.error ? "err" : null, "data-call": c.id},
        ...[j + 1, c.protocol, c.model, "+" + secs(c.start), c.first === null ? "–" : "+" + secs(c.first),
          c.end === null ? "–" : "+" + secs(c.end), c.finish, fmt(c.p), fmt(c.c), fmt(c.tools),
          c.seq < 0 ? "–" : c.seq + 1, c.error || ""].map((v) => h("td", null, v === null ? "–" : v))));
      const t = T && T[j];
      if (t) {
        const det = h("details", null, h("summary", null,
          `call ${j + 1}: ${t.new.length + t.more} new message(s)${t.from ? ` after ${t.from} already sent` : ""}` +
          (t.out ? " and its answer" : "")), ...t.new.map(messageView),
          t.more ? h("p", null, `… ${t.more} more message(s)`) : null);
        if (t.out) {
          const [content, reasoning, calls] = t.out;
          det.append(h("div", {class: "msg answer"}, h("b", null, "answer"), reasoning ? h("pre", {class: "reasoning"},
            reasoning) : null, content ? h("pre", null, content) : null,
            ...calls.map(([name, args]) => h("pre", {class: "tool"}, `${name}(${args})`))));
        }
        body.append(h("tr", {class: "text"}, h("td", {colspan: 12}, det)));
      }
    });
    const gone = IDX.text && !T && D.calls.length ?
      h("p", {class: "notice"}, "This session's conversation text was left out to keep the page under --report-max-mb.") :
      null;
    return [...present([h("h3", null, "Calls"), gone]), h("div", {class: "scroll"}, h("table", {class: "calls"}, h("thead", null, head), body))];
  }

  let current = -1;
  function renderSession(i) {
    current = i;
    const row = IDX.rows[i];
    const D = readJSON("polar-s-" + i);
    const v = views.session;
    if (!row || !D) { v.replaceChildren(h("p", null, "No such session.")); return; }
    const strips = readJSON("polar-t-" + i);
    const g = row[COL.group] < 0 ? "–" : IDX.groups[row[COL.group]];
    const facts = [["group", g], ["reward", fmt(row[COL.reward])], ["advantage", fmt(row[COL.advantage])],
      ["calls", fmt(row[COL.calls])], ["errors", fmt(row[COL.errors])], ["sequences", fmt(row[COL.sequences])],
      ["merge ratio", fmt(row[COL.merge_ratio], 2)], ["tokens", fmt(row[COL.tokens])],
      ["trainable", fmt(row[COL.trainable])], ["duration", secs(row[COL.seconds])],
      ["started", D.calls.length ? new Date(D.t0 * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–"],
      ["flags", bitsToNames(row[COL.flags], IDX.flags).join(", ") || "–"],
      ["breaks", bitsToNames(row[COL.causes], IDX.causes).join(", ") || "–"]];
    v.replaceChildren(...present([
      h("p", null, h("a", {href: "#sessions", onclick: (e) => { e.preventDefault(); openList(); }}, "‹ all sessions")),
      h("h2", {class: "session-name", "data-session": row[COL.session] === null ? "" : row[COL.session]},
        sessionName(row[COL.session])),
      h("dl", {class: "facts"}, ...facts.flatMap(([k, val]) => [h("dt", null, k), h("dd", null, val)])),
      strips || !D.seqs.length ? null : h("p", {class: "notice"},
        "This session's token strips were left out to keep the page under --report-max-mb."),
      D.calls.length ? timeline(D) : null, ...chainsView(D), ...sequencesView(D, strips), ...callsView(D, readJSON("polar-x-" + i))]));
    const tab = document.querySelector('#tabs a[data-tab="session"]');
    tab.hidden = false;
    tab.setAttribute("href", "#session/" + i);
    show("session");
  }

  function openList() {
    const q = new URLSearchParams(Object.entries(state).filter(([k, v]) => v && !(k === "page" && v === "1") &&
      !(k === "desc" && v === "0")));
    location.hash = "#sessions" + (q.toString() ? "?" + q : "");
  }

  function whenParsed(fn) {
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fn, {once: true});
    else fn();
  }

  function route() {
    const hash = location.hash.slice(1);
    const [name, query] = hash.split("?");
    if (IDX && name.startsWith("session/")) {
      const i = Number(name.slice(8));
      whenParsed(() => renderSession(i));
    } else if (IDX && name === "sessions") {
      const q = new URLSearchParams(query || "");
      for (const k of Object.keys(state)) state[k] = q.get(k) || (k === "page" ? "1" : k === "desc" ? "0" : "");
      renderList(false);
      show("sessions");
    } else if (name === "sessions" || name === "session") {
      show(name);
    } else {
      show("overview");
    }
  }

  window.addEventListener("hashchange", route);
  route();
  // The first render's mark (scripts/bench_report reads it): the frame after the first view was built.
  requestAnimationFrame(() => setTimeout(() => {
    window.__polarRendered = performance.now();
    performance.mark("polar-rendered");
  }, 0));
})();
