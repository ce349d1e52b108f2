/*
 * Pluto chat widget. Embed with one tag:
 *
 *   <script src="https://your-gateway/widget.js" data-agent="default" data-title="Ask us" defer></script>
 *
 * Attributes: data-agent (which agent, if the gateway's routes allow it), data-title,
 * data-open="true" (start open). Everything it shows is built with DOM nodes and textContent:
 * nothing the model or a visitor writes is ever parsed as HTML.
 */
(function () {
  "use strict";
  var script = document.currentScript;
  if (!script || !script.src || window.__plutoWidgetLoaded) { return; }
  window.__plutoWidgetLoaded = true;

  var base = new URL(script.src, location.href);
  var cfg = {
    agent: script.getAttribute("data-agent") || "",
    title: script.getAttribute("data-title") || "Chat",
    open: script.getAttribute("data-open") === "true",
  };
  var wsUrl = (base.protocol === "https:" ? "wss://" : "ws://") + base.host + "/ws";
  var tokenKey = "pluto-widget:" + base.host + ":token";
  var SAFE_LINK = /^(https?:|mailto:)/i;
  var CSS_FILE = "widget.css";  // served as the hashed name (providers/web/assets.py)

  // ---- small helpers -------------------------------------------------------------------------
  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function svg(pathD) {
    var ns = "http://www.w3.org/2000/svg";
    var s = document.createElementNS(ns, "svg");
    s.setAttribute("viewBox", "0 0 24 24");
    s.setAttribute("aria-hidden", "true");
    var p = document.createElementNS(ns, "path");
    p.setAttribute("d", pathD);
    s.appendChild(p);
    return s;
  }
  function storage(get, value) {
    try {
      if (get) { return window.localStorage.getItem(tokenKey); }
      window.localStorage.setItem(tokenKey, value);
    } catch (e) { /* storage disabled: the session lasts as long as the page */ }
    return null;
  }
  function newId() { return "m" + Date.now().toString(36) + Math.random().toString(36).slice(2, 8); }

  // ---- safe markdown: text → DOM nodes -------------------------------------------------------
  function safeHref(url) {
    url = String(url || "").trim();
    return SAFE_LINK.test(url) ? url : null;
  }
  var INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([\s\S]+?)\*\*|__([\s\S]+?)__|~~([\s\S]+?)~~|\*([^*\s][^*]*?)\*|\b_([^_\s][^_]*?)_\b|!?\[([^\]]*)\]\(\s*([^)\s]+)(?:\s+"[^"]*")?\s*\)|(https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])/;
  function inline(text, into) {
    while (text) {
      var m = INLINE.exec(text);
      if (!m) { into.appendChild(document.createTextNode(text)); return; }
      if (m.index) { into.appendChild(document.createTextNode(text.slice(0, m.index))); }
      if (m[2] !== undefined) { into.appendChild(el("code", null, m[2].trim() || m[2])); }
      else if (m[3] !== undefined || m[4] !== undefined) { inline(m[3] || m[4], into.appendChild(el("strong"))); }
      else if (m[5] !== undefined) { inline(m[5], into.appendChild(el("del"))); }
      else if (m[6] !== undefined || m[7] !== undefined) { inline(m[6] || m[7], into.appendChild(el("em"))); }
      else if (m[9] !== undefined) {
        // images in model text are shown as links: a picture would be fetched on its own
        var href = safeHref(m[9]);
        var label = m[8] || m[9];
        if (href) {
          var a = el("a", null, label);
          a.href = href; a.target = "_blank"; a.rel = "noopener noreferrer nofollow";
          into.appendChild(a);
        } else { into.appendChild(document.createTextNode(label)); }
      } else if (m[10] !== undefined) {
        var auto = el("a", null, m[10]);
        auto.href = m[10]; auto.target = "_blank"; auto.rel = "noopener noreferrer nofollow";
        into.appendChild(auto);
      }
      text = text.slice(m.index + m[0].length);
    }
  }
  function inlineLines(lines, into) {
    lines.forEach(function (line, i) {
      if (i) { into.appendChild(el("br")); }
      inline(line, into);
    });
  }
  function splitRow(line) {
    var s = line.trim().replace(/^\|/, "").replace(/\|$/, "");
    var cells = [], cur = "", i;
    for (i = 0; i < s.length; i++) {
      if (s[i] === "\\" && s[i + 1] === "|") { cur += "|"; i++; }
      else if (s[i] === "|") { cells.push(cur.trim()); cur = ""; }
      else { cur += s[i]; }
    }
    cells.push(cur.trim());
    return cells;
  }
  function isTableSep(line) { return /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/.test(line || ""); }
  function alignsOf(sep) {  // a Markdown table's rule: "---:" right, ":---:" center
    return splitRow(sep).map(function (c) {
      c = c.trim();
      return /^:-+:$/.test(c) ? "pluto-center" : /-:$/.test(c) ? "pluto-num" :
        /^:-/.test(c) ? "pluto-left" : null;
    });
  }
  var NUMBER = /^[-+\u2212]?[$\u20ac\u00a3\u00a5]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?(e[-+]?\d+)?%?$/i;
  function numbersRight(aligns, rows) {  // a column the table left open, all numbers: right
    return aligns.map(function (a, i) {
      if (a) { return a; }
      var cells = rows.map(function (r) { return (r[i] || "").trim(); }).filter(Boolean);
      var numeric = cells.length && cells.every(function (c) { return /\d/.test(c) && NUMBER.test(c); });
      return numeric ? "pluto-num" : null;
    });
  }
  function tableNode(columns, rows, note, plain, aligns) {
    var cell = plain ? function (text, node) { node.textContent = text; } : inline;
    var wrap = el("div", "pluto-table");
    var table = wrap.appendChild(el("table"));
    var tr = table.appendChild(el("thead")).appendChild(el("tr"));
    aligns = aligns || [];
    function fill(text, node) {  // short cells stay on one line; long text wraps between words
      cell(text, node);
      if (text.length > 40 && /\s/.test(text)) { node.classList.add("pluto-long"); }
    }
    columns.forEach(function (c, i) { fill(String(c), tr.appendChild(el("th", aligns[i]))); });
    var body = table.appendChild(el("tbody"));
    rows.forEach(function (row) {
      var r = body.appendChild(el("tr"));
      columns.forEach(function (_, i) {
        var v = row[i];
        fill(v === null || v === undefined ? "" : String(v), r.appendChild(el("td", aligns[i])));
      });
    });
    if (note) { wrap.appendChild(el("div", "pluto-note", note)); }
    return wrap;
  }
  var BLOCK_START = /^(\s*```|#{1,6}\s|\s*>|\s*([-*+]|\d{1,9}[.)])\s+|\s*(\*\s*){3,}$|\s*(-\s*){3,}$)/;
  function markdown(text, into) {
    var lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    var i = 0, m, buf;
    while (i < lines.length) {
      var line = lines[i];
      if (!line.trim()) { i++; continue; }
      if ((m = /^\s*(```+|~~~+)\s*([\w+-]*)/.exec(line))) {
        var fence = m[1], code = [];
        for (i++; i < lines.length && lines[i].trim().indexOf(fence) !== 0; i++) { code.push(lines[i]); }
        i++;
        var pre = into.appendChild(el("pre"));
        var c = pre.appendChild(el("code", null, code.join("\n")));
        if (m[2]) { c.setAttribute("data-lang", m[2]); }
        continue;
      }
      if ((m = /^(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line))) {
        inline(m[2], into.appendChild(el("h" + Math.min(6, m[1].length + 2))));
        i++; continue;
      }
      if (/^\s*((\*\s*){3,}|(-\s*){3,}|(_\s*){3,})$/.test(line)) { into.appendChild(el("hr")); i++; continue; }
      if (line.indexOf("|") !== -1 && isTableSep(lines[i + 1])) {
        var cols = splitRow(line), rows = [], aligns = alignsOf(lines[i + 1]);
        for (i += 2; i < lines.length && lines[i].indexOf("|") !== -1 && lines[i].trim(); i++) { rows.push(splitRow(lines[i])); }
        into.appendChild(tableNode(cols, rows, null, false, numbersRight(aligns, rows)));
        continue;
      }
      if (/^\s*>/.test(line)) {
        buf = [];
        for (; i < lines.length && /^\s*>/.test(lines[i]); i++) { buf.push(lines[i].replace(/^\s*>\s?/, "")); }
        markdown(buf.join("\n"), into.appendChild(el("blockquote")));
        continue;
      }
      if ((m = /^\s*([-*+]|\d{1,9}[.)])\s+/.exec(line))) {
        var ordered = /\d/.test(m[1]);
        var list = into.appendChild(el(ordered ? "ol" : "ul"));
        if (ordered && parseInt(m[1], 10) !== 1) { list.start = parseInt(m[1], 10); }
        var item = null;
        for (; i < lines.length; i++) {
          var li = /^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/.exec(lines[i]);
          if (li && /\d/.test(li[1]) === ordered) {
            item = list.appendChild(el("li"));
            inline(li[2], item);
          } else if (lines[i].trim() && /^\s{2,}/.test(lines[i]) && item) {
            item.appendChild(el("br")); inline(lines[i].trim(), item);
          } else { break; }
        }
        continue;
      }
      buf = [];
      for (; i < lines.length && lines[i].trim() && !(buf.length && BLOCK_START.test(lines[i])) &&
             !(lines[i].indexOf("|") !== -1 && isTableSep(lines[i + 1])); i++) { buf.push(lines[i]); }
      inlineLines(buf, into.appendChild(el("p")));
    }
  }

  // ---- the widget's DOM ----------------------------------------------------------------------
  var host = el("div");
  host.setAttribute("data-pluto-widget", "");
  var root = host.attachShadow ? host.attachShadow({ mode: "open" }) : host;
  var css = el("link");
  css.rel = "stylesheet";
  css.href = new URL(CSS_FILE, base).href;
  root.appendChild(css);

  var launcher = root.appendChild(el("button", "pluto-launcher"));
  launcher.type = "button";
  launcher.setAttribute("aria-label", "Open the chat");
  launcher.appendChild(svg("M4 4h16v11H8l-4 4z"));

  var panel = root.appendChild(el("section", "pluto-panel"));
  panel.setAttribute("aria-label", cfg.title);
  var header = panel.appendChild(el("header", "pluto-header"));
  var titles = header.appendChild(el("div", "pluto-titles"));
  titles.appendChild(el("div", "pluto-title", cfg.title));
  var status = titles.appendChild(el("div", "pluto-status", "Connecting…"));
  var closeBtn = header.appendChild(el("button", "pluto-close"));
  closeBtn.type = "button";
  closeBtn.setAttribute("aria-label", "Close the chat");
  closeBtn.appendChild(svg("M6 6l12 12M18 6L6 18"));
  var log = panel.appendChild(el("div", "pluto-log"));
  log.setAttribute("role", "log");
  log.setAttribute("aria-live", "polite");
  var form = panel.appendChild(el("form", "pluto-composer"));
  var input = form.appendChild(el("textarea", "pluto-input"));
  input.rows = 1;
  input.placeholder = "Write a message…";
  input.setAttribute("aria-label", "Your message");
  var sendBtn = form.appendChild(el("button", "pluto-send"));
  sendBtn.type = "submit";
  sendBtn.setAttribute("aria-label", "Send");
  sendBtn.appendChild(svg("M3 20l18-8L3 4v6l12 2-12 2z"));
  var stopBtn = form.appendChild(el("button", "pluto-stop"));
  stopBtn.type = "button";
  stopBtn.setAttribute("aria-label", "Stop the answer");
  stopBtn.appendChild(svg("M7 7h10v10H7z"));

  function setOpen(open) {
    panel.classList.toggle("pluto-open", open);
    launcher.classList.toggle("pluto-hidden", open);
    if (open) { input.focus(); scrollDown(); }
  }
  launcher.addEventListener("click", function () { setOpen(true); });
  closeBtn.addEventListener("click", function () { setOpen(false); });

  // ---- the conversation ----------------------------------------------------------------------
  var runs = {};      // run id → {node, body, tools, text, final}
  var pending = [];   // messages sent but not acknowledged: resent after a reconnect
  var active = {};    // run ids in progress

  function nearBottom() { return log.scrollHeight - log.scrollTop - log.clientHeight < 80; }
  function scrollDown() { log.scrollTop = log.scrollHeight; }
  function add(node) {
    var stick = nearBottom();
    log.appendChild(node);
    if (stick) { scrollDown(); }
    return node;
  }
  function userBubble(text, id) {
    var hint = log.querySelector(".pluto-hint");
    if (hint) { log.removeChild(hint); }
    var b = el("div", "pluto-msg pluto-user");
    if (id) { b.setAttribute("data-id", id); }
    b.appendChild(el("div", "pluto-bubble", text));
    return add(b);
  }
  function systemLine(text, cls) { return add(el("div", "pluto-system " + (cls || ""), text)); }
  function botBubble(runId) {
    if (runId && runs[runId]) { return runs[runId]; }
    var node = el("div", "pluto-msg pluto-bot");
    var tools = node.appendChild(el("div", "pluto-tools"));
    var body = node.appendChild(el("div", "pluto-bubble pluto-md"));
    var run = { node: node, body: body, tools: tools, text: "", final: false, calls: {} };
    if (runId) { runs[runId] = run; node.setAttribute("data-run", runId); }
    add(node);
    return run;
  }
  var drawQueued = {};
  function draw(run) {
    var stick = nearBottom();
    while (run.body.firstChild) { run.body.removeChild(run.body.firstChild); }
    markdown(run.text, run.body);
    run.node.classList.toggle("pluto-typing", !run.final && !run.text);
    if (stick) { scrollDown(); }
  }
  function drawSoon(run, runId) {
    if (drawQueued[runId]) { return; }
    drawQueued[runId] = true;
    (window.requestAnimationFrame || setTimeout)(function () { drawQueued[runId] = false; draw(run); });
  }
  function imageSrc(src) {
    if (/^data:image\/(png|jpeg|gif|webp);base64,/.test(src)) { return src; }
    if (/^https?:\/\//i.test(src)) { return src; }
    if (/^\/web\/file\//.test(src)) { return new URL(src, base).href; }
    return null;
  }
  function details(d, into) {
    if (!d) { return; }
    var box = into.appendChild(el("div", "pluto-details"));
    if (d.title) { box.appendChild(el("div", "pluto-detail-title", d.title)); }
    if (d.table && d.table.columns) {
      var shown = d.table.rows.length, total = d.table.total_rows || shown;
      var note = total > shown ? "Showing " + shown.toLocaleString("en-US") + " of " +
        total.toLocaleString("en-US") + " rows" + (d.csv ? "; all of them in the CSV" : "") :
        (d.table.truncated ? "Showing the first " + shown + " rows" : "");
      var numeric = (d.table.numeric || []).map(function (n) { return n ? "pluto-num" : null; });
      box.appendChild(tableNode(d.table.columns, d.table.rows, note, true, numeric));
    }
    if (d.csv && /^\/web\/file\//.test(d.csv)) {
      var dl = box.appendChild(el("a", "pluto-download", "Download the data (CSV)"));
      dl.href = new URL(d.csv, base).href;
      dl.setAttribute("download", "");
    }
    if (d.image) {
      var src = imageSrc(d.image);
      if (src) { var img = box.appendChild(el("img", "pluto-image")); img.alt = d.title || "chart"; img.src = src; }
    }
    if (d.text && !d.table) { box.appendChild(el("div", "pluto-detail-text", d.text)); }
  }
  function toolStart(run, f) {
    var line = run.tools.appendChild(el("div", "pluto-tool pluto-running", "Using " + f.name + "…"));
    run.calls[f.call_id] = line;
  }
  function toolProgress(run, f) {
    var line = run.calls[f.call_id];
    if (!line || line.className.indexOf("pluto-running") < 0) { return; }
    var part = f.total ? Math.round(100 * f.progress / f.total) + "%" : String(f.progress);
    line.textContent = "Using " + f.name + "… " + part + (f.message ? " · " + f.message : "");
  }
  function toolEnd(run, f) {
    var line = run.calls[f.call_id];
    if (!line) { line = run.tools.appendChild(el("div", "pluto-tool")); }
    line.className = "pluto-tool" + (f.is_error ? " pluto-tool-error" : "");
    line.textContent = (f.is_error ? "⚠ " : "✓ ") + f.name;
    details(f.details, run.tools);
  }
  function setBusy() {
    var busy = Object.keys(active).length > 0;
    form.classList.toggle("pluto-busy", busy);
  }

  function showHistory(messages) {
    runs = {};
    while (log.firstChild) { log.removeChild(log.firstChild); }
    if (!messages.length) { systemLine("Ask me anything. Send /help to see what I can do.", "pluto-hint"); }
    messages.forEach(function (m) {
      if (m.role === "user") { userBubble(m.text); return; }
      var run = botBubble(m.run_id);
      if (m.role === "tool") { details(m.details, run.tools); return; }
      run.text = run.text ? run.text + "\n\n" + m.text : m.text;
      run.final = true;
      draw(run);
    });
    pending.forEach(function (p) { userBubble(p.text, p.id).classList.add("pluto-pending"); });
    scrollDown();
  }

  function onFrame(f) {
    var run;
    switch (f.type) {
      case "ready":
        storage(false, f.token);
        setStatus("Online", "ok");
        if (f.limits) { input.maxLength = f.limits.max_message_chars; }
        if (f.reset === "expired") { resetNote = "Your earlier conversation expired; this is a new one."; }
        break;
      case "history":
        showHistory(f.messages || []);
        if (resetNote) { systemLine(resetNote); resetNote = null; }
        pending.forEach(function (p) { sendFrame({ type: "message", id: p.id, text: p.text }); });
        break;
      case "ack":
        if (notSent) { notSent = false; setStatus("Online", "ok"); }
        if (resendTimer) { clearTimeout(resendTimer); resendTimer = null; resendPending(); }
        pending = pending.filter(function (p) { return p.id !== f.reply_to; });
        var mine = log.querySelector('[data-id="' + String(f.reply_to).replace(/[^\w.:-]/g, "") + '"]');
        if (mine) { mine.classList.remove("pluto-pending"); }
        break;
      case "message.user":  // (sent again after a "not received": drawn once)
        if (!log.querySelector('[data-id="' + String(f.id).replace(/[^\w.:-]/g, "") + '"]')) { userBubble(f.text, f.id); }
        break;
      case "run.start":
        active[f.run_id] = true; setBusy();
        botBubble(f.run_id).node.classList.add("pluto-typing");
        break;
      case "message.delta":
        run = botBubble(f.run_id);
        if (!run.final) { run.text += f.text; drawSoon(run, f.run_id); }
        break;
      case "tool.start":
        run = botBubble(f.run_id);
        if (!run.final) { toolStart(run, f); }
        break;
      case "tool.progress":
        run = botBubble(f.run_id);
        if (!run.final) { toolProgress(run, f); }
        break;
      case "tool.end":
        run = botBubble(f.run_id);
        if (!run.final) { toolEnd(run, f); }
        break;
      case "message.final":
        run = botBubble(f.run_id);
        run.text = f.text; run.final = true; draw(run);
        break;
      case "run.end":
        delete active[f.run_id]; setBusy();
        run = botBubble(f.run_id);
        if (f.outcome === "cancelled" && !run.final) { run.node.classList.add("pluto-stopped"); }
        run.final = true; draw(run);
        if (!run.text && !run.tools.firstChild && !run.node.querySelector(".pluto-run-error") &&
            run.node.parentNode === log) { log.removeChild(run.node); }
        break;
      case "notice":
        systemLine(f.text);
        break;
      case "error":
        if (f.code === "not_received") { notReceived(f); break; }
        if (f.code === "rate_limited" || !f.run_id) { systemLine(f.message, "pluto-error"); }
        else { run = botBubble(f.run_id); run.final = true; draw(run); run.node.appendChild(el("div", "pluto-run-error", f.message)); }
        if (f.reply_to) { pending = pending.filter(function (p) { return p.id !== f.reply_to; }); }
        break;
    }
  }

  // the gateway could not record a message (its storage failed): keep it, say so in the status
  // bar and send what is pending again (same ids) after the wait it asks for
  var resendTimer = null, notSent = false;
  function resendPending() {
    pending.forEach(function (p) { sendFrame({ type: "message", id: p.id, text: p.text }); });
  }
  function notReceived(f) {
    if (!pending.some(function (p) { return p.id === f.reply_to; })) { return; }  // (sent since)
    var mine = log.querySelector('[data-id="' + String(f.reply_to).replace(/[^\w.:-]/g, "") + '"]');
    if (mine) { mine.classList.add("pluto-pending"); }
    notSent = true;
    setStatus("Not sent yet — trying again…", "wait");
    if (resendTimer) { return; }
    var wait = Math.min(15, Math.max(0.5, Number(f.retry_after) || 1));
    resendTimer = setTimeout(function () { resendTimer = null; resendPending(); }, wait * 1000);
  }

  // ---- the connection ------------------------------------------------------------------------
  var ws = null, ready = false, attempts = 0, retryTimer = null, resetNote = null;
  function setStatus(text, state) {
    status.textContent = text;
    status.setAttribute("data-state", state || "");
  }
  function sendFrame(frame) {
    if (ws && ready && ws.readyState === 1) { ws.send(JSON.stringify(frame)); return true; }
    return false;
  }
  function connect() {
    clearTimeout(retryTimer);
    retryTimer = null;
    if (ws && (ws.readyState === 0 || ws.readyState === 1)) { return; }
    setStatus(attempts ? "Reconnecting…" : "Connecting…", "wait");
    var sock = ws = new WebSocket(wsUrl);
    sock.onopen = function () {
      ready = true;
      sock.send(JSON.stringify({ type: "hello", token: storage(true), agent: cfg.agent || null }));
    };
    sock.onmessage = function (e) {
      var frame;
      try { frame = JSON.parse(e.data); } catch (err) { return; }
      if (frame.type === "ready") { attempts = 0; }
      onFrame(frame);
    };
    sock.onclose = function () {
      if (ws !== sock) { return; }
      ready = false; active = {}; setBusy();
      var delay = Math.min(15000, 500 * Math.pow(2, attempts++)) * (0.5 + Math.random() / 2);
      setStatus("Offline — reconnecting in " + Math.ceil(delay / 1000) + " s", "down");
      retryTimer = setTimeout(connect, delay);
    };
  }
  window.addEventListener("online", function () { if (retryTimer) { connect(); } });
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && retryTimer) { connect(); }
  });

  // ---- sending -------------------------------------------------------------------------------
  function submit() {
    var text = input.value;
    if (!text.trim()) { return; }
    var id = newId();
    var b = userBubble(text, id);
    pending.push({ id: id, text: text });
    if (!sendFrame({ type: "message", id: id, text: text })) { b.classList.add("pluto-pending"); }
    input.value = "";
    resize();
    scrollDown();
  }
  function resize() {
    input.style.height = "auto";
    input.style.height = Math.min(140, input.scrollHeight) + "px";
  }
  form.addEventListener("submit", function (e) { e.preventDefault(); submit(); });
  input.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
  });
  input.addEventListener("input", resize);
  stopBtn.addEventListener("click", function () { sendFrame({ type: "stop" }); });

  function start() {
    document.body.appendChild(host);
    setOpen(cfg.open);
    connect();
  }
  if (document.body) { start(); } else { document.addEventListener("DOMContentLoaded", start); }
})();
