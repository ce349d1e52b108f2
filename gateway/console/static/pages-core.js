/* Pluto console: overview, conversations (live runs), routes, usage and budgets
 * (docs/console.md). Drawn with ctx.h: data is text, never markup. */
(function () {
  "use strict";
  var C = window.PlutoConsole;
  if (!C) return;

  function when(ts) {
    if (!ts) return "";
    var d = new Date(ts * 1000);
    return d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }
  function money(x) { return "$" + (Number(x) || 0).toFixed((Number(x) || 0) < 1 ? 4 : 2); }
  function num(x) { return (Number(x) || 0).toLocaleString("en"); }
  function errorOf(r) {
    return (r.body && (r.body.error || r.body.message)) || ("HTTP " + r.status);
  }
  function section(h, title, id) {
    return h("section", {class: "card", "aria-labelledby": id}, h("h3", {id: id}, title));
  }

  // overview -------------------------------------------------------------------------------
  C.register("overview", {title: "Overview", role: "viewer", render: function (el, ctx) {
    var h = ctx.h;
    el.appendChild(h("h2", null, "Overview"));
    var stats = h("div", {class: "stats"});
    var providers = section(h, "Providers", "ov-providers");
    var runs = section(h, "Recent runs", "ov-runs");
    el.appendChild(stats);
    el.appendChild(h("div", {class: "grid2"}, providers, runs));
    ctx.api("GET", "/admin/overview").then(function (r) {
      if (r.status !== 200) { stats.appendChild(h("p", {class: "error"}, errorOf(r))); return; }
      var o = r.body;
      [["Runs in progress", num(o.runs_in_progress)], ["Runs today", num(o.runs_today)],
        ["Errors today", num(o.errors_today)], ["Awaiting approval", num(o.awaiting_approval)],
        ["Cost today", money(o.cost_today_usd)], ["Tokens today", num(o.tokens_today)],
        ["Configuration", (o.config_ok ? "in force" : "last edit refused") +
          " · generation " + o.config_generation]
      ].forEach(function (s) {
        stats.appendChild(h("div", {class: "stat" + (s[0] === "Errors today" &&
          o.errors_today ? " bad" : "")}, h("span", {class: "stat-label"}, s[0]),
          h("strong", {class: "stat-value"}, s[1])));
      });
      providers.appendChild(ctx.table([
        {key: "name", label: "Provider"},
        {key: "state", label: "State", render: function (p) {
          return h("span", {class: "badge " + (p.state === "running" ? "ok" : "bad")}, p.state);
        }},
        {key: "restarts", label: "Restarts", num: true},
        {key: "last_error", label: "Last error"}], o.providers,
      {label: "Providers", empty: "No provider is running."}));
    });
    ctx.api("GET", "/admin/runs?limit=10").then(function (r) {
      if (r.status !== 200) { runs.appendChild(h("p", {class: "error"}, errorOf(r))); return; }
      runs.appendChild(ctx.table([
        {key: "started_at", label: "Started", render: function (x) { return when(x.started_at); }},
        {key: "agent", label: "Agent"},
        {key: "status", label: "Status", render: function (x) {
          return h("span", {class: "badge " + statusClass(x.status)}, x.status);
        }},
        {key: "session_key", label: "Conversation", render: function (x) {
          // operators follow a run into its conversation (a viewer sees no transcript)
          return ctx.may("operator") && x.session_id ? h("a", {href: "#/conversations/" +
            encodeURIComponent(x.session_id)}, x.session_key) : x.session_key;
        }}], r.body.runs,
      {label: "Recent runs", empty: "No run yet."}));
    });
  }});

  function statusClass(s) {
    return s === "error" ? "bad" : s === "running" || s === "queued" ||
      s === "awaiting_approval" ? "live" : "ok";
  }

  // conversations ----------------------------------------------------------------------------
  C.register("conversations", {title: "Conversations", role: "operator",
    render: function (el, ctx) {
      return ctx.param ? transcript(el, ctx, ctx.param) : conversationList(el, ctx);
    }});

  function conversationList(el, ctx) {
    var h = ctx.h;
    el.appendChild(h("h2", null, "Conversations"));
    var live = section(h, "Runs in progress", "cv-live");
    var q = h("input", {id: "cv-q", type: "search", name: "q", placeholder: "words or a key"});
    var results = h("div", {class: "results"});
    var form = h("form", {class: "inline", role: "search"},
      h("label", {for: "cv-q"}, "Search conversations"), q,
      h("button", {type: "submit"}, "Search"));
    el.appendChild(live);
    el.appendChild(h("section", {class: "card", "aria-labelledby": "cv-found"},
      h("h3", {id: "cv-found"}, "Conversations"), form, results));
    function search() {
      ctx.api("GET", "/admin/conversations?limit=100&q=" + encodeURIComponent(q.value))
        .then(function (r) {
          ctx.clear(results);
          if (r.status !== 200) { results.appendChild(h("p", {class: "error"}, errorOf(r))); return; }
          results.appendChild(ctx.table([
            {key: "key", label: "Conversation", render: function (s) {
              return h("a", {href: "#/conversations/" + encodeURIComponent(s.id)}, s.key);
            }},
            {key: "agent", label: "Agent"},
            {key: "updated_at", label: "Last message", render: function (s) {
              return when(s.updated_at);
            }}], r.body.sessions, {label: "Conversations found",
            empty: q.value ? "No conversation holds these words." : "No conversation yet."}));
        });
    }
    form.addEventListener("submit", function (e) { e.preventDefault(); search(); });
    search();
    ctx.api("GET", "/admin/runs?status=running&limit=50").then(function (r) {
      if (r.status !== 200) { live.appendChild(h("p", {class: "error"}, errorOf(r))); return; }
      live.appendChild(ctx.table([
        {key: "session_key", label: "Conversation"},
        {key: "agent", label: "Agent"},
        {key: "input", label: "Asked"},
        {key: "id", label: "Follow", render: function (x) {
          return h("button", {type: "button", onclick: function () { openRun(ctx, x.id); }},
            "Follow live");
        }}], r.body.runs, {label: "Runs in progress", empty: "No run is in progress."}));
    });
  }

  function openRun(ctx, runId) {
    ctx.api("GET", "/admin/runs/" + encodeURIComponent(runId)).then(function (r) {
      if (r.status === 200) ctx.go("conversations/" + encodeURIComponent(r.body.run.session_id));
      else ctx.toast(errorOf(r), "error");
    });
  }

  function transcript(el, ctx, sessionId) {
    var h = ctx.h;
    var stops = [];
    var closed = false;
    el.appendChild(h("p", null, h("a", {href: "#/conversations"}, "← All conversations")));
    el.appendChild(h("h2", null, "Conversation"));
    var log = h("ol", {class: "transcript", "aria-label": "Messages"});
    var liveBox = h("div", {class: "live-runs", "aria-live": "polite"});
    var approvals = h("div");
    el.appendChild(log);
    el.appendChild(liveBox);
    el.appendChild(approvals);
    function load() {
      ctx.api("GET", "/admin/conversations/" + encodeURIComponent(sessionId)).then(function (r) {
        if (closed) return;
        ctx.clear(log);
        ctx.clear(approvals);
        if (r.status !== 200) { log.appendChild(h("li", {class: "error"}, errorOf(r))); return; }
        r.body.messages.forEach(function (m) { log.appendChild(message(h, m)); });
        if (r.body.approvals.length) {
          approvals.appendChild(h("h3", null, "Approval requests"));
          approvals.appendChild(ctx.table([
            {key: "tool", label: "Tool"}, {key: "arguments", label: "Arguments"},
            {key: "status", label: "Decision"}, {key: "decided_by", label: "By"},
            {key: "reason", label: "Reason"},
            {key: "created_at", label: "Asked", render: function (a) { return when(a.created_at); }}
          ], r.body.approvals, {label: "Approval requests"}));
        }
      });
    }
    load();
    // a run of this conversation in progress: followed live (its events as they come)
    ctx.api("GET", "/admin/runs?status=running&limit=50").then(function (r) {
      if (closed || r.status !== 200) return;
      r.body.runs.forEach(function (run) {
        ctx.api("GET", "/admin/runs/" + encodeURIComponent(run.id)).then(function (d) {
          if (closed || d.status !== 200 || d.body.run.session_id !== sessionId) return;
          followRun(run.id);
        });
      });
    });
    function followRun(runId) {
      var text = h("div", {class: "bubble"});
      var tools = h("ul", {class: "tools"});
      var state = h("span", {class: "badge live"}, "running");
      var box = h("li", {class: "msg assistant live", "data-run": runId},
        h("div", {class: "who"}, "assistant ", state), tools, text);
      liveBox.appendChild(h("ol", {class: "transcript"}, box));
      var stop = ctx.follow(runId, function (ev) {
        if (ev.type === "message.delta") text.textContent += ev.text;
        else if (ev.type === "message.final") text.textContent = ev.text;
        else if (ev.type === "tool.start") {
          tools.appendChild(h("li", {"data-call": ev.call_id}, "⚙ " + ev.name + " ",
            h("code", null, JSON.stringify(ev.arguments))));
        } else if (ev.type === "tool.end") {
          tools.appendChild(h("li", {class: ev.is_error ? "bad" : null},
            "↳ " + ev.name + ": " + clip(ev.content, 300)));
        } else if (ev.type === "approval.request") {
          tools.appendChild(h("li", {class: "live"}, "⏸ waiting for approval of " + ev.name));
        } else if (ev.type === "run.error") {
          tools.appendChild(h("li", {class: "bad"}, "Error: " + ev.message));
        } else if (ev.type === "run.end") {
          state.textContent = "ended: " + (ev.outcome || "done");
          state.className = "badge ok";
          box.classList.remove("live");
          load();
        }
      });
      stops.push(stop);
    }
    return function () { closed = true; stops.forEach(function (s) { s(); }); };
  }

  function clip(s, n) { s = String(s == null ? "" : s); return s.length > n ? s.slice(0, n) + "…" : s; }

  function message(h, m) {
    var parts = [h("div", {class: "who"}, m.role + (m.name ? " · " + m.name : ""),
      h("time", null, " " + when(m.created_at)))];
    if (m.content) {
      parts.push(m.role === "tool" ? h("pre", {class: "bubble tool-result"}, clip(m.content, 4000))
        : h("div", {class: "bubble"}, m.content));
    }
    (m.tool_calls || []).forEach(function (c) {
      var f = c["function"] || {};
      parts.push(h("div", {class: "tool-call"}, "⚙ " + (f.name || c.name || "tool") + " ",
        h("code", null, clip(f.arguments || JSON.stringify(c.arguments || {}), 2000))));
    });
    return h("li", {class: "msg " + m.role}, parts);
  }

  // routes ---------------------------------------------------------------------------------
  // a YAML file of the config dir, edited in place: Check (problems by line, the diff), Apply
  // (written and reloaded at once; 422 problems, 409 someone else's edit); admins only
  function fileEditor(ctx, spec) {
    var h = ctx.h;
    var admin = ctx.may("admin");
    var version = null;
    var id = spec.id;
    var editor = h("textarea", {id: id + "-text", class: "code", rows: String(spec.rows || 18),
      spellcheck: "false", readOnly: !admin, "aria-describedby": id + "-help"});
    var problems = h("div", {class: "problems", "aria-live": "polite"});
    var diff = h("div", {class: "diff-box", "aria-live": "polite"});
    var check = h("button", {type: "button", class: "check"}, "Check");
    var apply = h("button", {type: "button", class: "primary apply", disabled: !admin,
      title: admin ? null : "Changing " + spec.file + " takes the admin role"}, "Apply");
    var revert = h("button", {type: "button", class: "revert"}, "Reload from file");
    var edit = section(h, spec.file, id + "-edit");
    edit.appendChild(h("p", {id: id + "-help", class: "help"}, admin
      ? spec.help + " Check shows problems and the diff; Apply takes effect at once."
      : "Read only: changing " + spec.file + " takes the admin role."));
    edit.appendChild(h("label", {for: id + "-text", class: "sr-only"}, spec.file));
    edit.appendChild(editor);
    edit.appendChild(h("div", {class: "actions"}, check, admin ? apply : null, revert));
    edit.appendChild(problems);
    edit.appendChild(diff);

    function readFile() {
      return ctx.api("GET", spec.path + "/file").then(function (r) {
        if (r.status !== 200) { ctx.toast(errorOf(r), "error"); return; }
        editor.value = r.body.text || spec.empty || "";
        version = r.body.version;
        ctx.clear(problems);
        ctx.clear(diff);
      });
    }
    function showProblems(list) {
      ctx.clear(problems);
      if (!list.length) {
        problems.appendChild(h("p", {class: "ok"}, "No problems."));
        return;
      }
      problems.appendChild(h("h4", null, list.length === 1 ? "1 problem" : list.length + " problems"));
      problems.appendChild(h("ul", {class: "problem-list"}, list.map(function (p) {
        return h("li", {class: "problem"},
          h("button", {type: "button", class: "line link", onclick: function () {
            selectLine(editor, p.line);
          }}, p.line ? "Line " + p.line : p.file),
          " ", p.field ? h("code", null, p.field) : null, " ", p.message);
      })));
    }
    function showDiff(text, title) {
      ctx.clear(diff);
      if (!text) { diff.appendChild(h("p", {class: "help"}, "No change from the file in force.")); return; }
      diff.appendChild(h("h4", null, title || "Diff"));
      diff.appendChild(h("pre", {class: "diff"}, text.split("\n").map(function (line) {
        var k = line.indexOf("+++") === 0 || line.indexOf("---") === 0 ? "meta"
          : line[0] === "+" ? "add" : line[0] === "-" ? "del" : line.indexOf("@@") === 0 ? "meta" : "";
        return h("span", {class: k}, line + "\n");
      })));
    }
    check.addEventListener("click", function () {
      ctx.api("POST", spec.path + "/check", {text: editor.value}).then(function (r) {
        if (r.status !== 200) { ctx.toast(errorOf(r), "error"); return; }
        showProblems(r.body.problems);
        showDiff(r.body.diff, "Diff against the file in force");
      });
    });
    if (admin) apply.addEventListener("click", function () {
      apply.disabled = true;
      ctx.api("PUT", spec.path + "/file", {text: editor.value, version: version})
        .then(function (r) {
          apply.disabled = false;
          if (r.status === 200) {
            version = r.body.version;
            ctx.clear(problems);
            showDiff(r.body.diff, "Applied");
            ctx.toast(r.body.applied ? spec.applied + " (generation " + r.body.generation + ")."
              : "Written, but the reload was refused: see the overview.", r.body.applied ? "ok" : "error");
            if (spec.onApplied) spec.onApplied(r.body);
          } else if (r.status === 422) {
            showProblems(r.body.problems || []);
            ctx.toast("Not applied: " + spec.file + " has problems.", "error");
          } else if (r.status === 409) {
            ctx.toast("Someone changed " + spec.file + " since you read it: reload it and redo " +
              "your edit.", "error");
            showDiff("", "");
          } else {
            ctx.toast(errorOf(r), "error");
          }
        });
    });
    revert.addEventListener("click", readFile);
    readFile();
    return edit;
  }

  C.register("routes", {title: "Routes", role: "viewer", render: function (el, ctx) {
    var h = ctx.h;
    el.appendChild(h("h2", null, "Routes"));
    var edit = fileEditor(ctx, {id: "routes", file: "routes.yaml", path: "/admin/routes",
      help: "Edit the routing table.", applied: "Routes applied",
      onApplied: function () { loadTable(); }});
    var explain = section(h, "Explain a message", "rt-explain");
    var table = section(h, "The table in force", "rt-table");
    el.appendChild(edit);
    el.appendChild(h("div", {class: "grid2"}, explain, table));

    // explain
    var fields = {};
    var form = h("form", {class: "explain"});
    [["provider", "Provider", "web"], ["chat", "Chat id", ""], ["user", "User id", ""],
      ["text", "Text", ""]].forEach(function (f) {
      fields[f[0]] = h("input", {id: "ex-" + f[0], name: f[0], value: f[2],
        required: f[0] !== "text"});
      form.appendChild(h("label", {for: "ex-" + f[0]}, f[1]));
      form.appendChild(fields[f[0]]);
    });
    var group = h("input", {id: "ex-group", type: "checkbox"});
    var mention = h("input", {id: "ex-mention", type: "checkbox"});
    form.appendChild(h("div", {class: "checks"}, h("label", {for: "ex-group"}, group, " In a group"),
      h("label", {for: "ex-mention"}, mention, " Mentions the bot")));
    form.appendChild(h("button", {type: "submit"}, "Explain"));
    var answer = h("div", {class: "explained", "aria-live": "polite"});
    explain.appendChild(form);
    explain.appendChild(answer);
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      ctx.api("POST", "/admin/routes/explain", {provider: fields.provider.value,
        chat: fields.chat.value, user: fields.user.value, text: fields.text.value,
        group: group.checked, mention: mention.checked}).then(function (r) {
        ctx.clear(answer);
        if (r.status !== 200) { answer.appendChild(h("p", {class: "error"}, errorOf(r))); return; }
        answer.appendChild(h("dl", null, Object.keys(r.body).map(function (k) {
          var v = r.body[k];
          return [h("dt", null, k), h("dd", null, typeof v === "object" && v !== null
            ? JSON.stringify(v) : String(v))];
        })));
      });
    });

    function loadTable() {
      ctx.api("GET", "/admin/routes").then(function (r) {
        ctx.clear(table);
        table.appendChild(h("h3", {id: "rt-table"}, "The table in force"));
        if (r.status !== 200) { table.appendChild(h("p", {class: "error"}, errorOf(r))); return; }
        table.appendChild(h("p", {class: "help"}, "Generation " + r.body.generation +
          " · default agent: " + (r.body["default"] || "none")));
        table.appendChild(ctx.table([
          {key: "rule", label: "Rule"}, {key: "line", label: "Line", num: true},
          {key: "match", label: "Match", render: function (x) {
            return h("code", null, JSON.stringify(x.match || {}));
          }},
          {key: "agent", label: "Agent"},
          {key: "more", label: "Also", render: function (x) {
            var rest = {};
            Object.keys(x).forEach(function (k) {
              if (["rule", "line", "match", "agent"].indexOf(k) < 0) rest[k] = x[k];
            });
            return Object.keys(rest).length ? h("code", null, JSON.stringify(rest)) : "";
          }}], r.body.routes, {label: "Routes in force", empty: "No rule: every message goes to the default."}));
      });
    }
    loadTable();
  }});

  function selectLine(textarea, line) {
    var lines = textarea.value.split("\n");
    var n = Math.max(1, Math.min(line || 1, lines.length));
    var start = 0;
    for (var i = 0; i < n - 1; i++) start += lines[i].length + 1;
    textarea.focus();
    textarea.setSelectionRange(start, start + lines[n - 1].length);
    var lh = textarea.scrollHeight / Math.max(lines.length, 1);
    textarea.scrollTop = Math.max(0, (n - 3) * lh);
  }

  // usage and budgets ------------------------------------------------------------------------
  var GROUPS = ["agent", "user", "model", "provider", "route", "chat", "origin"];
  var PERIODS = [["today", "Today"], ["7d", "Last 7 days"], ["30d", "Last 30 days"],
    ["month", "This month"]];

  C.register("usage", {title: "Usage & budgets", role: "viewer", render: function (el, ctx) {
    var h = ctx.h;
    el.appendChild(h("h2", null, "Usage and budgets"));
    var by = h("select", {id: "us-by"}, GROUPS.map(function (g) { return h("option", {value: g}, g); }));
    var since = h("select", {id: "us-since"}, PERIODS.map(function (p) {
      return h("option", {value: p[0]}, p[1]);
    }));
    since.value = "30d";
    var groups = section(h, "Spend by group", "us-groups");
    groups.appendChild(h("form", {class: "inline"}, h("label", {for: "us-by"}, "Group by"), by,
      h("label", {for: "us-since"}, "Period"), since));
    var groupOut = h("div");
    groups.appendChild(groupOut);
    var days = section(h, "Spend per day (last 14 days, UTC)", "us-days");
    var budgets = section(h, "Budgets", "us-budgets");
    el.appendChild(budgets);
    el.appendChild(h("div", {class: "grid2"}, groups, days));

    function drawGroups() {
      ctx.api("GET", "/admin/usage?by=" + by.value + "&since=" + since.value).then(function (r) {
        ctx.clear(groupOut);
        if (r.status !== 200) { groupOut.appendChild(h("p", {class: "error"}, errorOf(r))); return; }
        var rows = r.body.rows;
        var useCost = r.body.total.cost > 0;
        groupOut.appendChild(hbars(h, rows.slice(0, 12).map(function (x) {
          return {label: x.key, value: useCost ? x.cost : x.total_tokens,
            text: useCost ? money(x.cost) : num(x.total_tokens) + " tokens"};
        }), (useCost ? "Cost" : "Tokens") + " by " + by.value));
        groupOut.appendChild(ctx.table([
          {key: "key", label: by.value}, {key: "calls", label: "Calls", num: true},
          {key: "total_tokens", label: "Tokens", num: true, render: function (x) { return num(x.total_tokens); }},
          {key: "cost", label: "Cost", num: true, render: function (x) { return money(x.cost); }}],
        rows, {label: "Usage by " + by.value, empty: "No model call in this period."}));
      });
    }
    by.addEventListener("change", drawGroups);
    since.addEventListener("change", drawGroups);
    drawGroups();

    // per day: the last 14 days and today (UTC), a day without a call drawn as nothing spent
    var midnight = new Date();
    midnight.setUTCHours(0, 0, 0, 0);
    var dayKeys = [];
    for (var i = 14; i >= 0; i--) {
      dayKeys.push(new Date(midnight.getTime() - i * 86400000).toISOString().slice(0, 10));
    }
    ctx.api("GET", "/admin/usage?by=day&since=" + dayKeys[0]).then(function (r) {
      if (r.status !== 200) { days.appendChild(h("p", {class: "error"}, errorOf(r))); return; }
      var useCost = r.body.total.cost > 0;
      var of = {};
      r.body.rows.forEach(function (x) { of[x.key] = x; });
      days.appendChild(vbars(h, dayKeys.map(function (d) {
        var x = of[d] || {cost: 0, total_tokens: 0};
        var v = useCost ? x.cost : x.total_tokens;
        return {label: d.slice(5), value: v, text: useCost ? money(v) : num(v) + " tokens"};
      }), (useCost ? "Cost" : "Tokens") + " per day"));
    });

    // budgets.yaml, edited in place (admins); what each budget's keys spent, with resets
    var budgetsFile = fileEditor(ctx, {id: "budgets", file: "budgets.yaml", rows: 8,
      path: "/admin/usage/budgets",
      empty: "budgets:\n  # - {per: user, period: day, tokens: 200000}\n",
      help: "Budgets kept apart from pluto.yaml: per agent, route, user or chat, per day or " +
        "month, in tokens and/or dollars.", applied: "Budgets applied",
      onApplied: function () { drawBudgets(); }});
    el.insertBefore(budgetsFile, budgets.nextSibling);

    function drawBudgets() {
      ctx.api("GET", "/admin/usage/budgets").then(function (r) {
        ctx.clear(budgets);
        budgets.appendChild(h("h3", {id: "us-budgets"}, "Budgets"));
        budgets.appendChild(h("p", {class: "help"},
          "Limits come from budgets.yaml (below) and pluto.yaml (usage.budgets). " +
          (ctx.may("admin") ? "Reset lets a key spend its whole budget again this period."
            : "Resetting a budget takes the admin role.")));
        if (r.status !== 200) { budgets.appendChild(h("p", {class: "error"}, errorOf(r))); return; }
        if (!r.body.budgets.length) {
          budgets.appendChild(h("p", {class: "empty"}, "No budget is set."));
          return;
        }
        r.body.budgets.forEach(function (b, i) {
          var limit = [b.tokens ? num(b.tokens) + " tokens" : null, b.cost ? money(b.cost) : null]
            .filter(Boolean).join(" / ");
          var title = "Per " + b.per + (b.only ? " " + b.only : "") + ", per " + b.period +
            ": " + limit;
          budgets.appendChild(h("h4", {id: "budget-" + i}, title));
          budgets.appendChild(ctx.table([
            {key: "key", label: b.per},
            {key: "used", label: "Used", render: function (s) {
              var frac = Math.max(b.tokens ? s.total_tokens / b.tokens : 0, b.cost ? s.cost / b.cost : 0);
              return h("span", {class: "used"}, h("meter", {min: "0", max: "1", low: "0.8",
                high: "0.95", optimum: "0", value: String(Math.min(1, frac)),
                "aria-label": "share of the budget used"}),
              " " + Math.round(frac * 100) + "%" + (s.over ? " · over" : ""));
            }},
            {key: "total_tokens", label: "Tokens", num: true, render: function (s) { return num(s.total_tokens); }},
            {key: "cost", label: "Cost", num: true, render: function (s) { return money(s.cost); }},
            {key: "reset", label: "Reset", render: function (s) {
              if (!ctx.may("admin")) return s.reset_at ? "reset " + when(s.reset_at) : "";
              return h("button", {type: "button", class: "reset", "aria-label":
                "Reset the budget of " + b.per + " " + s.key, onclick: function () {
                  if (!window.confirm("Reset what " + s.key + " spent this " + b.period + "?")) return;
                  ctx.api("POST", "/admin/usage/reset", {scope: b.per, key: s.key}).then(function (x) {
                    if (x.status === 200) { ctx.toast("Budget of " + s.key + " reset.", "ok"); drawBudgets(); }
                    else ctx.toast(errorOf(x), "error");
                  });
                }}, "Reset");
            }}], b.spent, {label: title, empty: "Nothing spent this period."}));
        });
      });
    }
    drawBudgets();
  }});

  // charts: inline SVG, drawn here (no library) --------------------------------------------
  function hbars(h, items, title) {
    if (!items.length) return h("p", {class: "empty"}, "Nothing to chart.");
    var max = Math.max.apply(null, items.map(function (x) { return x.value; })) || 1;
    var row = 26, w = 600, labelW = 180;
    var svg = h("svg:svg", {viewBox: "0 0 " + w + " " + (items.length * row + 4), class: "chart",
      role: "img", "aria-label": title});
    svg.appendChild(h("svg:title", null, title));
    items.forEach(function (x, i) {
      var y = i * row + 2;
      var bw = Math.max(1, (w - labelW - 110) * x.value / max);
      svg.appendChild(h("svg:text", {x: labelW - 8, y: y + 17, "text-anchor": "end",
        class: "label"}, clip(x.label, 26)));
      svg.appendChild(h("svg:rect", {x: labelW, y: y + 3, width: bw.toFixed(1), height: row - 8,
        rx: 3, class: "bar"}, h("svg:title", null, x.label + ": " + x.text)));
      svg.appendChild(h("svg:text", {x: (labelW + bw + 6).toFixed(1), y: y + 17, class: "value"}, x.text));
    });
    return svg;
  }

  function vbars(h, items, title) {
    var max = Math.max.apply(null, items.map(function (x) { return x.value; }));
    var w = 600, ht = 220, base = 190, gap = 4;
    var bw = (w - 20) / items.length - gap;
    var svg = h("svg:svg", {viewBox: "0 0 " + w + " " + ht, class: "chart", role: "img",
      "aria-label": title});
    svg.appendChild(h("svg:title", null, title));
    svg.appendChild(h("svg:line", {x1: 10, x2: w - 10, y1: base, y2: base, class: "axis"}));
    items.forEach(function (x, i) {
      var bh = max > 0 ? Math.max(x.value > 0 ? 2 : 0, (base - 24) * x.value / max) : 0;
      var left = 10 + i * (bw + gap);
      svg.appendChild(h("svg:rect", {x: left.toFixed(1), y: (base - bh).toFixed(1),
        width: bw.toFixed(1), height: bh.toFixed(1), rx: 2, class: "bar"},
      h("svg:title", null, x.label + ": " + x.text)));
      if (i % 2 === 0 || items.length <= 8) {
        svg.appendChild(h("svg:text", {x: (left + bw / 2).toFixed(1), y: base + 18,
          "text-anchor": "middle", class: "label small"}, x.label));
      }
    });
    if (max <= 0) {
      svg.appendChild(h("svg:text", {x: w / 2, y: base / 2, "text-anchor": "middle",
        class: "label"}, "No spend in these days."));
    }
    return svg;
  }
})();
