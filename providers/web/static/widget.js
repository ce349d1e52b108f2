/*
 * Pluto chat widget. Embed with one tag:
 *
 *   <script src="https://your-gateway/widget.js" data-agent="default" data-title="Ask us" defer></script>
 *
 * Attributes: data-agent (which agent, if the gateway's routes allow it), data-title,
 * data-open="true" (start open). Colours, fonts and sizes are CSS variables the page may set
 * (docs/widget.md). Everything it shows is built with DOM nodes and textContent: nothing the
 * model or a visitor writes is ever parsed as HTML.
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
  var ORIGIN_SETTING = "providers.web.allowed_origins";
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
  var chips = panel.appendChild(el("div", "pluto-files"));
  var form = panel.appendChild(el("form", "pluto-composer"));
  var attachBtn = form.appendChild(el("button", "pluto-attach"));
  attachBtn.type = "button";
  attachBtn.setAttribute("aria-label", "Attach a file");
  attachBtn.title = "Attach a file (or paste, or drop it here)";
  attachBtn.appendChild(svg("M16.5 6.5l-7.8 7.8a2 2 0 0 0 2.8 2.8l7.8-7.8a4 4 0 0 0-5.7-5.7L5.8 11.4a6 6 0 0 0 8.5 8.5l6.2-6.2"));
  var picker = form.appendChild(el("input", "pluto-picker"));
  picker.type = "file";
  picker.multiple = true;
  picker.tabIndex = -1;
  // the microphone: only where the browser can record, and only on a secure page (https or
  // localhost: elsewhere browsers refuse getUserMedia)
  var canRecord = !!(window.MediaRecorder && window.isSecureContext && navigator.mediaDevices &&
    navigator.mediaDevices.getUserMedia);
  var micBtn = canRecord ? form.appendChild(el("button", "pluto-mic")) : null;
  var recTime = canRecord ? form.appendChild(el("span", "pluto-rec-time", "0:00")) : null;
  if (micBtn) {
    micBtn.type = "button";
    micBtn.setAttribute("aria-pressed", "false");
    micBtn.appendChild(svg("M12 3a3 3 0 0 0-3 3v6a3 3 0 0 0 6 0V6a3 3 0 0 0-3-3zM5 11a7 7 0 0 0 14 0M12 18v3"));
    recTime.setAttribute("aria-hidden", "true");
  }
  var drop = panel.appendChild(el("div", "pluto-drop", "Drop files to send them"));
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
  function userBubble(text, id, names, runId) {
    var hint = log.querySelector(".pluto-hint");
    if (hint) { log.removeChild(hint); }
    var b = el("div", "pluto-msg pluto-user");
    if (id) { b.setAttribute("data-id", id); }
    if (runId) { b.setAttribute("data-run-of", runId); }  // (the history's: the run it started)
    var bubble = b.appendChild(el("div", "pluto-bubble", text));
    (names || []).forEach(function (name) { bubble.appendChild(el("div", "pluto-attached", name)); });
    return add(b);
  }
  function bubbleOf(id) {
    return log.querySelector('.pluto-user[data-id="' + String(id).replace(/[^\w.:-]/g, "") + '"]');
  }
  function systemLine(text, cls) { return add(el("div", "pluto-system " + (cls || ""), text)); }
  // an answer is drawn after the message it answers (and that message's earlier answers): a
  // run shown late — found after a reconnect, or run on another instance — keeps its place
  function anchorOf(runId, messageId) {
    var clean = function (v) { return String(v).replace(/[^\w.:-]/g, ""); };
    var at = runId && log.querySelector('.pluto-user[data-run-of="' + clean(runId) + '"]');
    if (at && messageId && !at.getAttribute("data-id")) {  // (learnt: a run answering it again
      at.setAttribute("data-id", messageId);  // after this one is cut off goes here too)
    }
    at = at || (messageId && bubbleOf(messageId));
    if (!at) { return null; }
    while (at.nextSibling && at.nextSibling.classList.contains("pluto-bot")) { at = at.nextSibling; }
    return at;
  }
  function botBubble(runId, messageId) {
    if (runId && runs[runId]) { return runs[runId]; }
    var node = el("div", "pluto-msg pluto-bot");
    var tools = node.appendChild(el("div", "pluto-tools"));
    var body = node.appendChild(el("div", "pluto-bubble pluto-md"));
    var run = { node: node, body: body, tools: tools, text: "", final: false, calls: {} };
    copyButton(node.appendChild(el("div", "pluto-actions")), run);
    if (runId) { runs[runId] = run; node.setAttribute("data-run", runId); }
    var at = anchorOf(runId, messageId);
    if (at && at.nextSibling) { log.insertBefore(node, at.nextSibling); } else { add(node); }
    return run;
  }
  function copyButton(into, run) {
    var b = into.appendChild(el("button", "pluto-copy"));
    b.type = "button";
    b.setAttribute("aria-label", "Copy the answer");
    b.appendChild(svg("M9 9h11v12H9zM5 15H4V3h12v1"));
    var label = b.appendChild(el("span", null, "Copy"));
    var timer = null;
    b.addEventListener("click", function () {
      copyText(run.text, function (ok) {
        label.textContent = ok ? "Copied" : "Could not copy";
        clearTimeout(timer);
        timer = setTimeout(function () { label.textContent = "Copy"; }, 1500);
      });
    });
  }
  function copyText(text, done) {
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done(true); },
        function () { done(copyBySelection(text)); });
    } else { done(copyBySelection(text)); }
  }
  function copyBySelection(text) {  // pages served over plain http have no clipboard API
    var area = el("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.cssText = "position:fixed;top:0;left:0;opacity:0;";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    return ok;
  }
  var drawQueued = {};
  function draw(run) {
    var stick = nearBottom();
    if (run.drawn !== run.text) {  // (the same text is not drawn again: a selection stays)
      while (run.body.firstChild) { run.body.removeChild(run.body.firstChild); }
      markdown(run.text, run.body);
      run.drawn = run.text;
    }
    run.node.classList.toggle("pluto-typing", !run.final && !run.text);
    run.node.classList.toggle("pluto-done", run.final && !!run.text.trim());
    if (stick) { scrollDown(); }
  }
  function drawSoon(run, runId) {
    if (drawQueued[runId]) { return; }
    drawQueued[runId] = true;
    (window.requestAnimationFrame || setTimeout)(function () { drawQueued[runId] = false; draw(run); });
  }
  function voiceClip(f) {
    if (typeof f.url !== "string" || !/^\/web\/file\//.test(f.url)) { return; }
    var node = el("div", "pluto-msg pluto-bot pluto-voice");
    var audio = node.appendChild(document.createElement("audio"));
    audio.controls = true; audio.preload = "none";
    audio.src = new URL(f.url, base).href;
    audio.setAttribute("aria-label", "The answer, spoken");
    add(node);
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
    if (f.child_run_id) { childBlock(run, f); return; }
    var line = run.tools.appendChild(el("div", "pluto-tool pluto-running", "Using " + f.name + "…"));
    run.calls[f.call_id] = line;
  }
  // an agent asked by a tool call (ask_<agent>): its run's work drawn inside the asking
  // bubble as a <details> (collapsed; its summary is a button to the keyboard) holding its
  // tool lines and its answer's text, filled by the child's frames (parent_run_id)
  var RUN_ID = /^[A-Za-z0-9_.:-]{1,64}$/;
  function agentOf(name) { return String(name || "").replace(/^ask_/, "") || "an agent"; }
  function childBlock(run, f) {
    if (!RUN_ID.test(String(f.child_run_id)) || runs[f.child_run_id]) { return; }
    var who = agentOf(f.name), asked = f.question ? ": " + String(f.question) : "";
    var node = run.tools.appendChild(el("details", "pluto-child"));
    node.setAttribute("data-child-run", f.child_run_id);
    var summary = node.appendChild(el("summary", "pluto-tool pluto-running", "Asking " + who + asked + "…"));
    summary.setAttribute("data-child", who + asked);
    var tools = node.appendChild(el("div", "pluto-tools"));
    var body = node.appendChild(el("div", "pluto-md pluto-child-answer"));
    run.calls[f.call_id] = summary;
    runs[f.child_run_id] = { node: node, body: body, tools: tools, text: "", final: false, calls: {}, child: true };
  }
  function childFrame(f) {
    var parent = runs[f.parent_run_id], child = runs[f.run_id];
    if (!parent || !child || !child.child) { return; }  // (its block comes with the asking call)
    switch (f.type) {
      case "message.delta":
        if (!child.final) { child.text += f.text; drawSoon(child, f.run_id); }
        break;
      case "tool.start": case "tool.progress": case "tool.end":
        if (!child.final) { TOOL_FRAMES[f.type](child, f); }
        break;
      case "message.final":
        child.text = f.text; child.final = true; draw(child);
        break;
      case "error":
        child.final = true; draw(child);
        child.node.appendChild(el("div", "pluto-run-error", f.message));
        break;
      case "run.end":
        child.final = true; draw(child);
        if (f.outcome === "cancelled" && !child.node.querySelector(":scope > .pluto-stop-mark")) {
          child.node.appendChild(el("div", "pluto-stop-mark", "Stopped."));
        }
        break;
    }
  }
  function toolProgress(run, f) {
    var line = run.calls[f.call_id];
    if (!line || line.className.indexOf("pluto-running") < 0 || line.hasAttribute("data-child")) { return; }
    var part = f.total ? Math.round(100 * f.progress / f.total) + "%" : String(f.progress);
    line.textContent = "Using " + f.name + "… " + part + (f.message ? " · " + f.message : "");
  }
  function toolEnd(run, f) {
    var line = run.calls[f.call_id];
    if (!line) { line = run.tools.appendChild(el("div", "pluto-tool")); }
    line.className = "pluto-tool" + (f.is_error ? " pluto-tool-error" : "");
    var child = line.getAttribute("data-child");
    line.textContent = (f.is_error ? "⚠ " : "✓ ") + (child !== null ? "Asked " + child : f.name);
    details(f.details, run.tools);
  }
  var TOOL_FRAMES = {"tool.start": toolStart, "tool.progress": toolProgress, "tool.end": toolEnd};
  // a tool call waiting for the visitor's decision (docs/approvals.md): a card with the call's
  // arguments (text only, whatever the model wrote in them) and Approve / Deny, each a command
  // sent as the visitor's message; the decision comes back as the first frame of the run that
  // resumes it
  var approvals = {};  // approval id → {node, buttons, line}
  var APPROVAL_ID = /^[a-z2-9]{6,16}$/;
  function approvalRequest(run, f) {
    if (!APPROVAL_ID.test(String(f.approval_id)) || approvals[f.approval_id]) { return; }
    var card = run.tools.appendChild(el("div", "pluto-approval"));
    card.setAttribute("data-approval", f.approval_id);
    card.setAttribute("role", "group");
    card.setAttribute("aria-label", "Approval needed for " + f.name);
    card.appendChild(el("div", "pluto-approval-title", "The agent wants to run " + f.name + " with:"));
    card.appendChild(el("pre", "pluto-approval-args", String(f.arguments || "")));
    if (f.approvers) { card.appendChild(el("div", "pluto-note", String(f.approvers) + " may decide.")); }
    var row = card.appendChild(el("div", "pluto-approval-buttons"));
    var item = { node: card, buttons: [], line: null };
    [["Approve", "/approve ", "pluto-approve"], ["Deny", "/deny ", "pluto-deny"]].forEach(function (b) {
      var button = row.appendChild(el("button", b[2], b[0]));
      button.type = "button";
      button.setAttribute("aria-label", b[0] + " running " + f.name);
      button.addEventListener("click", function () {
        if (button.disabled) { return; }
        item.buttons.forEach(function (x) { x.disabled = true; });
        sendCommand(b[1] + f.approval_id);
      });
      item.buttons.push(button);
    });
    approvals[f.approval_id] = item;
  }
  var DECIDED = { approved: function (t, by) { return "✅ " + t + " approved" + (by ? " by " + by : "") + "."; },
    denied: function (t, by) { return "🚫 " + t + " denied" + (by ? " by " + by : "") + "."; },
    expired: function (t) { return "⏱ Nobody approved " + t + " in time, so it was not run."; },
    cancelled: function (t) { return t + " was not run (the request was cancelled)."; } };
  function approvalDecision(run, f) {
    var say = DECIDED[f.verdict] || DECIDED.cancelled;
    var text = say(String(f.name || "the tool"), f.by ? String(f.by) : "");
    var item = approvals[f.approval_id];
    if (item) {
      item.buttons.forEach(function (x) { x.disabled = true; });
      if (!item.line) { item.line = item.node.appendChild(el("div", "pluto-approval-decision", text)); }
      return;
    }
    run.tools.appendChild(el("div", "pluto-approval-decision", text));
  }
  TOOL_FRAMES["approval.request"] = approvalRequest;
  TOOL_FRAMES["approval.decision"] = approvalDecision;
  function setBusy() {
    var busy = Object.keys(active).length > 0;
    form.classList.toggle("pluto-busy", busy);
  }

  function showHistory(messages) {
    runs = {}; approvals = {};
    while (log.firstChild) { log.removeChild(log.firstChild); }
    if (!messages.length) { systemLine("Ask me anything. Send /help to see what I can do.", "pluto-hint"); }
    messages.forEach(function (m) {
      if (m.role === "user") { userBubble(m.text, m.id || null, m.files, m.run_id); return; }  // (id: the tab's)
      var run = botBubble(m.run_id);
      if (m.role === "tool") { details(m.details, run.tools); return; }
      if (m.role === "run.end") { ended(run, m.outcome, m.error); return; }
      if (m.role === "approval.request") {  // a paused run: its buttons while still open
        approvalRequest(run, m);
        if (!m.open && approvals[m.approval_id]) { approvals[m.approval_id].buttons.forEach(function (x) { x.disabled = true; }); }
        return;
      }
      run.text = run.text ? run.text + "\n\n" + m.text : m.text;
      run.final = true;
      draw(run);
    });
    // sent, not acknowledged, yet recorded (the history shows it waiting): not drawn twice
    pending = pending.filter(function (p) { return !bubbleOf(p.id); });
    pending.forEach(function (p) { userBubble(p.text, p.id, p.names).classList.add("pluto-pending"); });
    Object.keys(failed).forEach(function (id) { var p = failed[id]; drawNotSent(userBubble(p.text, p.id, p.names), p, true); });
    scrollDown();
  }
  // how an answer ended when not plainly, live or from the history: stopped, or failed
  function ended(run, outcome, error) {
    run.final = true;
    draw(run);
    if (outcome === "cancelled") {
      if (run.text) { run.node.classList.add("pluto-stopped"); }
      else if (!run.node.querySelector(".pluto-stop-mark")) { run.node.appendChild(el("div", "pluto-stop-mark", "Stopped.")); }
    }
    if (error && !run.node.querySelector(".pluto-run-error")) { run.node.appendChild(el("div", "pluto-run-error", error)); }
  }

  function onFrame(f) {
    var run;
    if (f.parent_run_id) { childFrame(f); return; }  // a child run's, nested in its parent
    switch (f.type) {
      case "ready":
        storage(false, f.token);
        setStatus("Online", "ok");
        if (f.limits) {
          input.maxLength = f.limits.max_message_chars;
          limits.max_upload_bytes = f.limits.max_upload_bytes || limits.max_upload_bytes;
          limits.max_files = f.limits.max_files || limits.max_files;
          VOICE_SECONDS = f.limits.max_voice_seconds || VOICE_SECONDS;
        }
        if (Number(f.ping_seconds) >= 1) { pingSeconds = Number(f.ping_seconds); }
        if (f.reset === "expired") { resetNote = "Your earlier conversation expired; this is a new one."; }
        break;
      case "history":
        showHistory(f.messages || []);
        if (resetNote) { systemLine(resetNote); resetNote = null; }
        pending.forEach(function (p) { sendFrame(messageFrame(p)); });
        pumpFiles();
        break;
      case "ack":
        if (notSent) { notSent = false; setStatus("Online", "ok"); }
        if (resendTimer) { clearTimeout(resendTimer); resendTimer = null; resendPending(); }
        pending = pending.filter(function (p) { return p.id !== f.reply_to; });
        var mine = bubbleOf(f.reply_to);
        if (mine) { mine.classList.remove("pluto-pending"); }
        if (failed[f.reply_to] && !failed[f.reply_to].refused) {  // recorded after all
          delete failed[f.reply_to];
          if (mine) { clearNotSent(mine); }
        }
        break;
      case "refused":  // recorded, but the gateway will not answer it (a rate limit, a full queue)
        refusedMessage(f.reply_to);
        break;
      case "message.user":  // (sent again after a "not received": drawn once)
        if (!bubbleOf(f.id)) { userBubble(f.text, f.id, f.files); }
        break;
      case "file.accept":
        fileAccepted(f.reply_to);
        break;
      case "file.received":
        fileReceived(f.reply_to);
        break;
      case "run.start":
        active[f.run_id] = true; setBusy();
        botBubble(f.run_id, f.message_id).node.classList.add("pluto-typing");
        break;
      case "message.delta":
        run = botBubble(f.run_id);
        if (!run.final) { run.text += f.text; drawSoon(run, f.run_id); }
        break;
      case "tool.start":
      case "tool.progress":
      case "tool.end":
      case "approval.request":
      case "approval.decision":
        run = botBubble(f.run_id);
        if (!run.final) { TOOL_FRAMES[f.type](run, f); }
        break;
      case "message.final":
        run = botBubble(f.run_id);
        run.text = f.text; run.final = true; draw(run);
        break;
      case "run.end":
        delete active[f.run_id]; setBusy();
        if (f.outcome === "interrupted" && runs[f.run_id]) {  // cut off (its instance stopped):
          run = runs[f.run_id];  // answered again, in a run of its own, in the same place
          if (run.node.parentNode === log) { log.removeChild(run.node); }
          delete runs[f.run_id];
          break;
        }
        run = botBubble(f.run_id);
        if (f.outcome === "cancelled" && !run.final && run.text) { run.node.classList.add("pluto-stopped"); }
        if (f.outcome === "cancelled" && !run.final && !run.text && run.tools.firstChild &&
            !run.node.querySelector(":scope > .pluto-stop-mark")) { run.node.appendChild(el("div", "pluto-stop-mark", "Stopped.")); }
        run.final = true; draw(run);
        if (!run.text && !run.tools.firstChild && !run.node.querySelector(".pluto-run-error") &&
            run.node.parentNode === log) { log.removeChild(run.node); }
        break;
      case "pong":  // (the connection lives: heard)
        break;
      case "notice":
        systemLine(f.text);
        break;
      case "voice":  // a spoken answer, after its text: a clip to play
        voiceClip(f);
        break;
      case "error":
        if (f.code === "not_received") { notReceived(f); break; }
        if (f.code === "file_refused") { fileRefused(f.reply_to, f.message); break; }
        if (f.code === "rate_limited") { rateLimited(f); break; }
        if (!f.run_id) { systemLine(f.message, "pluto-error"); }
        else { run = botBubble(f.run_id); run.final = true; draw(run); run.node.appendChild(el("div", "pluto-run-error", f.message)); }
        if (f.reply_to && f.code !== "gateway") {  // (a "gateway" error answers a recorded one)
          var refused = pending.filter(function (p) { return p.id === f.reply_to; })[0];
          if (refused) { markNotSent(refused, true); }  // refused by the socket: not sent
        } else if (f.reply_to) { pending = pending.filter(function (p) { return p.id !== f.reply_to; }); }
        break;
    }
  }

  // the gateway could not record a message (its storage failed): keep it, say so in the status
  // bar and send what is pending again (same ids) after the wait it asks for
  var resendTimer = null, notSent = false;
  function resendPending() {
    pending.forEach(function (p) { sendFrame(messageFrame(p)); });
  }
  function messageFrame(p) {
    var frame = { type: "message", id: p.id, text: p.text };
    if (p.files && p.files.length) { frame.files = p.files; }
    return frame;
  }
  function notReceived(f) {
    if (!pending.some(function (p) { return p.id === f.reply_to; })) { return; }  // (sent since)
    var mine = bubbleOf(f.reply_to);
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
    if (ws && ready && ws.readyState === 1) {
      ws.send(JSON.stringify(frame));
      if (frame.type !== "stop") { expectAnswer(); }  // (a stop with nothing to stop says nothing)
      return true;
    }
    return false;
  }
  function connect() {
    clearTimeout(retryTimer);
    retryTimer = null;
    if (ws && (ws.readyState === 0 || ws.readyState === 1)) { return; }
    setStatus(attempts ? "Reconnecting…" : "Connecting…", "wait");
    var sock = ws = new WebSocket(wsUrl), opened = false;
    sock.binaryType = "arraybuffer";
    expectBy = 0; expectAnswer();  // opened and said ready, or taken for dead
    sock.onopen = function () {
      ready = true; opened = true;
      sock.send(JSON.stringify({ type: "hello", token: storage(true), agent: cfg.agent || null }));
      expectBy = 0; expectAnswer();
    };
    sock.onmessage = function (e) {
      var frame;
      if (ws === sock) { heard(); }
      try { frame = JSON.parse(e.data); } catch (err) { return; }
      if (frame.type === "ready") { attempts = 0; }
      onFrame(frame);
    };
    sock.onclose = function (e) {
      if (ws !== sock) { return; }
      ready = false; active = {}; setBusy(); filesLost(); expectBy = 0;
      if (e.code === 4403 || /origin/i.test(e.reason || "")) { originRefused(); return; }
      if (opened) { retryLater(); return; }
      // refused before it opened: a browser does not say why, so ask whether it is this page's origin
      originAllowed(function (allowed) { if (allowed) { retryLater(); } else { originRefused(); } });
    };
  }
  // ---- is anyone there? ----------------------------------------------------------------------
  // An instance stopped (SIGSTOP, a frozen VM, a dead proxy) keeps its connections open and says
  // nothing: the tab would wait for ever. After pingSeconds with nothing heard it pings, and a
  // connection silent that long after a frame that expects an answer (hello, a message, a file,
  // a ping) is dropped for a new one — which sends the messages not acknowledged again (same
  // ids: one recorded already is not recorded twice).
  var pingSeconds = 15, heardAt = 0, expectBy = 0, lastBuffered = 0;
  function clock() { return performance.now(); }  // (monotonic: a clock set back or ahead is no silence)
  function heard() { heardAt = clock(); expectBy = 0; }
  function expectAnswer() { if (!expectBy) { expectBy = clock() + pingSeconds * 1000; } }
  function watch() {
    if (!ws || retryTimer) { return; }
    var now = clock();
    if (ws.readyState === 1 && ready) {
      var buffered = ws.bufferedAmount;  // a file's bytes still leaving: slow, not dead
      if (expectBy && buffered && buffered < lastBuffered) { expectBy = now + pingSeconds * 1000; }
      lastBuffered = buffered;
      if (!expectBy && heardAt && now - heardAt >= pingSeconds * 1000) {
        ws.send(JSON.stringify({ type: "ping" }));
        expectAnswer();
      }
    }
    if (expectBy && now > expectBy) { abandon(); }
  }
  function abandon() {
    var dead = ws;
    ws = null; ready = false; active = {}; setBusy(); filesLost(); expectBy = 0;
    try { dead.close(4000, "no answer"); } catch (err) { /* (closing already) */ }
    if (attempts === 0) { attempts = 1; connect(); } else { retryLater(); }
  }
  (function tick() { watch(); setTimeout(tick, Math.min(1000, pingSeconds * 250)); })();

  function retryLater() {
    var delay = Math.min(15000, 500 * Math.pow(2, attempts++)) * (0.5 + Math.random() / 2);
    setStatus("Offline — reconnecting in " + Math.ceil(delay / 1000) + " s", "down");
    retryTimer = setTimeout(connect, delay);
  }
  function originAllowed(done) {  // true also when the gateway cannot be asked (it is down)
    if (!window.fetch) { done(true); return; }
    fetch(base.origin + "/web/origin", { method: "POST", cache: "no-store", credentials: "omit" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (answer) { done(!answer || answer.allowed !== false); },
        function () { done(true); });
  }
  function originRefused() {
    var origin = location.origin && location.origin !== "null" ? location.origin : "this page's origin";
    setStatus("Not available on this site", "down");
    if (!log.querySelector(".pluto-refused")) {
      systemLine("This site (" + origin + ") is not allowed to open this chat: the gateway's admin " +
        "should add " + origin + " to " + ORIGIN_SETTING + " in pluto.yaml.", "pluto-error pluto-refused");
    }
    form.classList.add("pluto-disabled");
    input.disabled = true;
  }
  window.addEventListener("online", function () { if (retryTimer) { connect(); } });
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && retryTimer) { connect(); }
  });

  // ---- files to send: announced, then their bytes over the socket, one at a time --------------
  var files = [];        // {id, file, name, size, state: waiting|announced|sending|ready, chip}
  var uploading = null;  // the file whose bytes are going out
  var limits = { max_upload_bytes: 20 * 1048576, max_files: 10 };
  var CHUNK = 32768, HIGH_WATER = 1048576;
  function humanSize(n) {
    return n >= 1048576 ? +(n / 1048576).toPrecision(3) + " MB" : +(n / 1024).toPrecision(3) + " kB";
  }
  function addFiles(list, autoSend) {
    Array.prototype.forEach.call(list || [], function (file) {
      var name = file.name || "pasted file";
      if (files.length >= limits.max_files) {
        systemLine(name + " was not added: at most " + limits.max_files + " files go with one message.", "pluto-error");
      } else if (file.size > limits.max_upload_bytes) {
        systemLine(name + " is too large to send here (" + humanSize(file.size) + "; the limit is " +
          humanSize(limits.max_upload_bytes) + ").", "pluto-error");
      } else if (!file.size) {
        systemLine(name + " is empty.", "pluto-error");
      } else {
        var item = { id: "f" + newId().slice(1), file: file, name: name, size: file.size, state: "waiting",
          autoSend: !!autoSend };
        item.chip = chips.appendChild(el("div", "pluto-file"));
        item.chip.appendChild(el("span", "pluto-file-name", name));
        item.meter = item.chip.appendChild(el("span", "pluto-file-state", humanSize(file.size)));
        var remove = item.chip.appendChild(el("button", "pluto-file-remove", "×"));
        remove.type = "button";
        remove.setAttribute("aria-label", "Remove " + name);
        remove.addEventListener("click", function () { dropFile(item); });
        files.push(item);
      }
    });
    pumpFiles();
    updateSend();
  }
  function fileById(id) { return files.filter(function (f) { return f.id === id; })[0]; }
  function dropFile(item) {
    files = files.filter(function (f) { return f !== item; });
    if (item.chip.parentNode) { item.chip.parentNode.removeChild(item.chip); }
    if (uploading === item) { uploading = null; pumpFiles(); }  // (the next announce ends it)
    updateSend();
  }
  var pumpTimer = null;
  function pumpFiles() {
    if (uploading || !ready) { return; }
    if (Date.now() < limitedUntil) {  // over the rate limit: announced once it has passed
      if (!pumpTimer) { pumpTimer = setTimeout(function () { pumpTimer = null; pumpFiles(); }, limitedUntil - Date.now() + 50); }
      return;
    }
    var next = files.filter(function (f) { return f.state === "waiting"; })[0];
    if (!next) { return; }
    uploading = next;
    next.state = "announced";
    next.meter.textContent = "0%";
    sendFrame({ type: "file", id: next.id, name: next.name, mime: next.file.type || null, size: next.size });
  }
  function fileAccepted(id) {
    var item = fileById(id);
    if (!item || uploading !== item) { return; }
    item.state = "sending";
    var sock = ws;
    readBytes(item.file).then(function (bytes) {
      var offset = 0;
      (function step() {
        if (uploading !== item || ws !== sock || !ready) { return; }
        while (offset < bytes.byteLength && sock.bufferedAmount < HIGH_WATER) {
          sock.send(bytes.slice(offset, offset + CHUNK));
          offset += CHUNK;
        }
        item.meter.textContent = Math.floor(100 * Math.max(0, Math.min(offset, bytes.byteLength) - sock.bufferedAmount) / bytes.byteLength) + "%";
        if (offset < bytes.byteLength) { setTimeout(step, 20); }
      })();
    }, function () { fileRefused(id, item.name + " could not be read from your device."); });
  }
  function readBytes(file) {  // (File.arrayBuffer is missing from older Safari)
    if (file.arrayBuffer) { return file.arrayBuffer(); }
    return new Promise(function (resolve, reject) {
      var reader = new FileReader();
      reader.onload = function () { resolve(reader.result); };
      reader.onerror = function () { reject(reader.error); };
      reader.readAsArrayBuffer(file);
    });
  }
  function fileReceived(id) {
    var item = fileById(id);
    if (item) {
      item.state = "ready";
      item.meter.textContent = humanSize(item.size);
      item.chip.classList.add("pluto-file-ready");
    }
    if (uploading === item || !item) { uploading = null; }
    pumpFiles();
    updateSend();
    var allReady = files.every(function (f) { return f.state === "ready"; });
    if (allReady && files.some(function (f) { return f.autoSend; })) { submit(); }  // a voice note
  }
  function fileRefused(id, message) {
    var item = fileById(id);
    systemLine(message, "pluto-error");
    if (item) { dropFile(item); }
    if (uploading === item) { uploading = null; }
    pumpFiles();
  }
  function filesLost() {  // the socket closed: what it had received (and no message took) is gone
    uploading = null;
    files.forEach(function (f) { f.state = "waiting"; f.meter.textContent = humanSize(f.size); f.chip.classList.remove("pluto-file-ready"); });
    updateSend();
  }
  function updateSend() {
    var waiting = files.some(function (f) { return f.state !== "ready"; });
    sendBtn.disabled = waiting;
    sendBtn.setAttribute("aria-label", waiting ? "Send (waiting for the files)" : "Send");
  }

  // ---- over the rate limit: what the gateway dropped is shown as not sent, with a retry --------
  var failed = {};       // message id → the message: not sent, kept for a retry
  var limitedUntil = 0;
  function rateLimited(f) {
    limitedUntil = Date.now() + 1000 * Math.min(120, Math.max(1, Number(f.retry_after) || 5));
    systemLine(f.message, "pluto-error");
    pending.slice().forEach(function (p) { markNotSent(p, true); });  // (an ack that follows clears it)
    if (uploading && uploading.state === "announced") {  // (its announcement may have been dropped)
      uploading.state = "waiting";
      uploading.meter.textContent = humanSize(uploading.size);
      uploading = null;
      pumpFiles();
    }
  }
  function refusedMessage(id) {
    var p = pending.filter(function (q) { return q.id === id; })[0] || failed[id];
    var node = bubbleOf(id);
    if (!p && node) {  // sent from another tab
      var text = node.querySelector(".pluto-bubble").firstChild;
      p = { id: id, text: text && text.nodeType === 3 ? text.nodeValue : "", files: [], names: [] };
    }
    if (!p) { return; }
    p.refused = true;  // (a retry is a new message: this one is recorded)
    markNotSent(p, true);
  }
  function markNotSent(p, retry) {
    pending = pending.filter(function (q) { return q.id !== p.id; });
    if (retry) { failed[p.id] = p; }
    var node = bubbleOf(p.id);
    if (node) { drawNotSent(node, p, retry); }
  }
  function drawNotSent(node, p, retry) {
    node.classList.remove("pluto-pending");
    node.classList.add("pluto-failed");
    clearNotSent(node, true);
    var note = node.appendChild(el("div", "pluto-not-sent", "Not sent"));
    if (retry) {
      note.appendChild(document.createTextNode(" · "));
      var again = note.appendChild(el("button", "pluto-retry", "Retry"));
      again.type = "button";
      again.addEventListener("click", function () { retrySend(p.id); });
    }
  }
  function clearNotSent(node, keepClass) {
    var note = node.querySelector(".pluto-not-sent");
    if (note) { node.removeChild(note); }
    if (!keepClass) { node.classList.remove("pluto-failed"); }
  }
  function retrySend(id) {
    var p = failed[id], node = bubbleOf(id);
    if (!p || !node) { return; }
    if (Date.now() < limitedUntil) {
      var note = node.querySelector(".pluto-not-sent");
      if (note) { note.firstChild.textContent = "Not sent yet — wait " + Math.ceil((limitedUntil - Date.now()) / 1000) + " s"; }
      return;
    }
    delete failed[id];
    clearNotSent(node);
    if (p.refused) {  // the gateway has this one: the retry is a new message
      p = { id: newId(), text: p.text, files: [], names: p.names };
      node.setAttribute("data-id", p.id);  // (its files went with the first: attach them again)
    }
    pending.push(p);
    if (!sendFrame(messageFrame(p))) { node.classList.add("pluto-pending"); }
  }

  // ---- sending -------------------------------------------------------------------------------
  function sendCommand(text) {  // a button's command, sent as the visitor's message
    var id = newId();
    var msg = { id: id, text: text, files: [], names: [] };
    var b = userBubble(text, id, []);
    if (Date.now() < limitedUntil) { failed[id] = msg; drawNotSent(b, msg, true); return; }
    pending.push(msg);
    if (!sendFrame(messageFrame(msg))) { b.classList.add("pluto-pending"); }
    scrollDown();
  }
  function submit() {
    var text = input.value;
    if (files.some(function (f) { return f.state !== "ready"; })) { return; }  // (the button says so)
    if (!text.trim() && !files.length) { return; }
    var id = newId();
    var msg = { id: id, text: text, files: files.map(function (f) { return f.id; }),
      names: files.map(function (f) { return f.name; }) };
    files.forEach(function (f) { if (f.chip.parentNode) { chips.removeChild(f.chip); } });
    files = [];
    updateSend();
    var b = userBubble(text, id, msg.names);
    if (Date.now() < limitedUntil) { failed[id] = msg; drawNotSent(b, msg, true); }
    else {
      pending.push(msg);
      if (!sendFrame(messageFrame(msg))) { b.classList.add("pluto-pending"); }
    }
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
  attachBtn.addEventListener("click", function () { picker.click(); });
  picker.addEventListener("change", function () { addFiles(picker.files); picker.value = ""; });
  input.addEventListener("paste", function (e) {  // a pasted file (a screenshot, a copied CSV)
    var data = e.clipboardData;
    if (data && data.files && data.files.length && !data.getData("text/plain")) {
      e.preventDefault();
      addFiles(data.files);
    }
  });
  function dragsFiles(e) {
    return e.dataTransfer && Array.prototype.indexOf.call(e.dataTransfer.types || [], "Files") >= 0;
  }
  var dragDepth = 0;
  panel.addEventListener("dragenter", function (e) {
    if (!dragsFiles(e)) { return; }
    e.preventDefault();
    dragDepth++;
    panel.classList.add("pluto-dragging");
  });
  panel.addEventListener("dragover", function (e) { if (dragsFiles(e)) { e.preventDefault(); } });
  panel.addEventListener("dragleave", function () {
    if (dragDepth && !--dragDepth) { panel.classList.remove("pluto-dragging"); }
  });
  panel.addEventListener("drop", function (e) {
    if (!dragsFiles(e)) { return; }
    e.preventDefault();
    dragDepth = 0;
    panel.classList.remove("pluto-dragging");
    addFiles(e.dataTransfer.files);
  });

  // ---- voice: the microphone records a note, sent as a file (the gateway hears it) ------------
  var VOICE_SECONDS = 300;  // the gateway's voice.max_seconds unless it says otherwise
  var VOICE_TYPES = ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm", "audio/mp4"];
  var recording = null;     // {recorder, stream, chunks, bytes, started, ticker}
  function voiceType() {
    var can = MediaRecorder.isTypeSupported || function () { return false; };
    return VOICE_TYPES.filter(function (t) { return can.call(MediaRecorder, t); })[0] || "";
  }
  function voiceName(type) {
    var ext = /ogg/.test(type) ? "ogg" : /mp4|aac/.test(type) ? "m4a" : /mpeg/.test(type) ? "mp3" : "webm";
    return "voice-" + new Date().toTimeString().slice(0, 8).replace(/:/g, "") + "." + ext;
  }
  function micState(on) {
    form.classList.toggle("pluto-recording", on);
    micBtn.setAttribute("aria-pressed", on ? "true" : "false");
    micBtn.setAttribute("aria-label", on ? "Stop recording and send" : "Record a voice message");
    micBtn.title = on ? "Stop recording and send (Escape: discard)" : "Record a voice message";
    recTime.textContent = "0:00";
  }
  function startRecording() {
    micBtn.disabled = true;
    navigator.mediaDevices.getUserMedia({ audio: true }).then(function (stream) {
      micBtn.disabled = false;
      var type = voiceType();
      var rec = recording = { stream: stream, chunks: [], bytes: 0, started: Date.now(),
        recorder: type ? new MediaRecorder(stream, { mimeType: type }) : new MediaRecorder(stream) };
      rec.recorder.ondataavailable = function (e) { voiceData(rec, e.data); };
      rec.recorder.onstop = function () { recorded(rec); };
      rec.recorder.start(1000);
      rec.ticker = setInterval(function () { voiceTick(rec); }, 250);
      micState(true);
    }, function (err) {
      micBtn.disabled = false;
      systemLine(micRefusal(err), "pluto-error");
    });
  }
  function voiceData(rec, data) {
    if (!data || !data.size) { return; }
    rec.chunks.push(data);
    rec.bytes += data.size;
    if (rec.bytes > limits.max_upload_bytes * 0.9) { stopRecording(false); }  // (within the cap)
  }
  function voiceTick(rec) {
    var seconds = Math.floor((Date.now() - rec.started) / 1000);
    recTime.textContent = Math.floor(seconds / 60) + ":" + ("0" + seconds % 60).slice(-2);
    if (seconds >= VOICE_SECONDS) { stopRecording(false); }
  }
  function micRefusal(err) {
    var name = err && err.name;
    if (name === "NotAllowedError" || name === "SecurityError") {
      return "The microphone is blocked for this page; allow it in your browser to send a voice message.";
    }
    if (name === "NotFoundError") { return "No microphone was found, so a voice message cannot be recorded."; }
    return "The microphone could not be started (" + (name || "an error") + ").";
  }
  function stopRecording(discard) {
    var rec = recording;
    if (!rec) { return; }
    recording = null;
    rec.discard = discard;
    clearInterval(rec.ticker);
    micState(false);
    if (rec.recorder.state !== "inactive") { rec.recorder.stop(); } else { recorded(rec); }
  }
  function recorded(rec) {
    rec.stream.getTracks().forEach(function (t) { t.stop(); });
    if (rec.discard) { return; }
    var type = (rec.recorder.mimeType || voiceType() || "audio/webm").split(";")[0];
    var blob = new Blob(rec.chunks, { type: type });
    if (!blob.size) { systemLine("Nothing was recorded; please try again.", "pluto-error"); return; }
    blob.name = voiceName(type);  // (a Blob with a name is enough for addFiles)
    addFiles([blob], true);
  }
  if (micBtn) {
    micState(false);
    micBtn.addEventListener("click", function () { if (recording) { stopRecording(false); } else { startRecording(); } });
    micBtn.addEventListener("keydown", function (e) {
      if (e.key === "Escape" && recording) { e.preventDefault(); stopRecording(true); }
    });
  }

  function start() {
    document.body.appendChild(host);
    setOpen(cfg.open);
    connect();
  }
  if (document.body) { start(); } else { document.addEventListener("DOMContentLoaded", start); }
})();
