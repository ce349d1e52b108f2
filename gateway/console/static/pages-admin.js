/* The console's admin pages (issue 35): agents, datasets, schedules, pairing, accounts,
 * API keys and the audit log. Loaded by index.html after app.js; each page is registered with
 * window.PlutoConsole.register(id, {title, role, render}) and draws with ctx.h (text only:
 * nothing from the server ever goes through innerHTML), ctx.table, ctx.api and ctx.toast.
 * A control a role may not use is not drawn (the server refuses it anyway). */
(function () {
  "use strict";

  const PC = window.PlutoConsole;
  if (!PC || typeof PC.register !== "function") {
    return;  // the shell did not load: nothing to register with
  }

  const RANK = {viewer: 0, operator: 1, admin: 2, owner: 3};
  const ROLES = ["viewer", "operator", "admin", "owner"];
  let uid = 0;

  // ---- helpers --------------------------------------------------------------------------------

  function kids(list) {
    const out = [];
    (function walk(items) {
      for (const k of items) {
        if (k === null || k === undefined || k === false) continue;
        if (Array.isArray(k)) walk(k);
        else out.push(typeof k === "number" ? String(k) : k);
      }
    })(list);
    return out;
  }

  // a node's children replaced (null and false left out, arrays flattened; text as text)
  function fill(node, ...items) {
    node.replaceChildren(...kids(items));
  }

  function Maker(ctx) {
    const el = (tag, attrs, ...children) => ctx.h(tag, attrs || {}, ...kids(children));
    const may = (role) => !!(ctx.me && ctx.me.can && ctx.me.can[role]) ||
      (ctx.me && RANK[ctx.me.role] >= RANK[role]);
    const on = (node, event, fn) => { node.addEventListener(event, fn); return node; };
    const button = (text, fn, attrs) => on(el("button", Object.assign({type: "button"},
      attrs || {}), text), "click", fn);
    // columns: their labels; rows: arrays of cells (text or nodes), as ctx.table draws them
    const table = (columns, rows, label, empty) => {
      const t = ctx.table(columns.map((c, i) => ({key: String(i), label: c,
        render: (r) => r[i]})), rows, {label: label, empty: empty});
      // words stay whole: on a phone the table scrolls sideways in its frame instead
      t.querySelectorAll("th, td").forEach((cell) => { cell.style.overflowWrap = "break-word"; });
      return t;
    };
    // a labelled control: the label names it for screen readers and for a click
    const field = (label, control, hint) => {
      const id = control.id || ("pc-f" + (++uid));
      control.id = id;
      const parts = [el("label", {"for": id}, label), control];
      if (hint) {
        const hid = id + "-hint";
        control.setAttribute("aria-describedby", hid);
        parts.push(el("small", {id: hid, "class": "pc-hint"}, hint));
      }
      const box = el("div", {"class": "pc-field"}, parts);
      box.style.display = "flex";
      box.style.flexDirection = "column";
      box.style.gap = "0.2rem";
      box.style.minWidth = "0";
      return box;
    };
    const input = (attrs) => el("input", Object.assign({type: "text"}, attrs || {}));
    const select = (options, value, attrs) => {
      const s = el("select", attrs || {}, options.map((o) => el("option", {value: o}, o)));
      if (value !== undefined) s.value = value;
      return s;
    };
    const form = (label, ...children) => {
      const f = el("form", {"aria-label": label, "class": "pc-form inline"}, children);
      f.style.display = "flex";
      f.style.flexWrap = "wrap";
      f.style.gap = "0.5rem";
      f.style.alignItems = "flex-end";
      return f;
    };
    // a place for a page's messages: read out when they change
    const status = () => el("div", {"class": "pc-status", role: "status", "aria-live": "polite"});
    const say = (box, text, kind) => {
      fill(box);
      if (text) {
        box.append(el("p", {"class": "pc-msg " + (kind || "info"),
          role: kind === "error" ? "alert" : null}, text));
      }
    };
    return {el, may, on, button, table, field, input, select, form, status, say};
  }

  function when(seconds) {
    if (seconds === null || seconds === undefined || seconds === "") return "—";
    const d = new Date(Number(seconds) * 1000);
    if (isNaN(d.getTime())) return String(seconds);
    const pad = (n) => String(n).padStart(2, "0");
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes());
  }

  function problemOf(res) {
    const b = res && res.body;
    if (b && typeof b === "object" && b.error) return String(b.error);
    if (typeof b === "string" && b.trim()) return b.trim().slice(0, 300);
    return "the gateway answered " + (res ? res.status : "nothing");
  }

  async function call(ctx, method, path, body) {
    try {
      return await ctx.api(method, path, body);
    } catch (e) {
      return {status: 0, body: {error: "the gateway could not be reached (" + e + ")"}};
    }
  }

  const ok = (res) => res.status >= 200 && res.status < 300;
  const enc = encodeURIComponent;

  // "asks twice": a destructive button turns into Yes/No in place (keyboard friendly, no dialog)
  function confirmInPlace(m, label, question, action) {
    const box = m.el("span", {"class": "pc-confirm"});
    const first = m.button(label, () => {
      const yes = m.button("Yes, " + label.toLowerCase(), async () => {
        yes.disabled = true;
        await action();
      }, {"class": "danger"});
      yes.style.color = "var(--bad)";
      const no = m.button("No", () => { fill(box, first); first.focus(); });
      fill(box, m.el("span", {}, question + " "), yes, " ", no);
      yes.focus();
    }, {"class": "danger", "aria-label": label + ": " + question});
    first.style.color = "var(--bad)";
    box.append(first);
    return box;
  }

  // a page whose drawing happens again on each change
  function page(el, ctx, title, draw) {
    const m = Maker(ctx);
    const heading = m.el("h2", {tabindex: "-1"}, title);
    const msg = m.status();
    const body = m.el("div", {"class": "pc-body"});
    body.style.overflowWrap = "break-word";  // a long path or id wraps on a phone
    msg.style.overflowWrap = "break-word";
    fill(el, heading, msg, body);
    let alive = true;
    const api = {
      m, msg, body,
      alive: () => alive,
      say: (text, kind) => m.say(msg, text, kind),
      redraw: async () => {
        try {
          if (alive) await draw(api);
        } catch (e) {  // a bug or an answer of an unexpected shape: said, not thrown
          if (alive) m.say(msg, "This page failed: " + (e && e.message ? e.message : e), "error");
        }
      },
    };
    api.redraw();
    return () => { alive = false; };
  }

  // ---- agents ---------------------------------------------------------------------------------

  // the test chat: a conversation of one's own with this agent, whatever routes.yaml says; the
  // answer streams in from the run's events (POST /admin/agents/{name}/chat, docs/console.md)
  function testChat(ctx, v, name) {
    const m = v.m;
    const fresh = () => Math.random().toString(36).slice(2, 12);
    let conversation = fresh();
    const log = m.el("ol", {"class": "transcript pc-test-chat", role: "log",
      "aria-label": "Test chat with " + name});
    const input = m.el("textarea", {rows: "2", name: "test-message", spellcheck: "true"});
    input.style.width = "100%";
    input.style.boxSizing = "border-box";
    const send = m.el("button", {type: "submit", "class": "primary"}, "Send");
    const restart = m.button("New conversation", () => {
      conversation = fresh();
      fill(log);
      input.focus();
    });
    const form = m.el("form", {"aria-label": "Test chat with " + name},
      m.field("Message to " + name, input, "Spends tokens like any conversation; only you " +
        "see it here (and operators on the conversations page)."),
      m.el("div", {"class": "pc-actions"}, send, " ", restart));
    const bubble = (who, text, kind) => {
      const body = m.el("div", {"class": "bubble"}, text);
      log.append(m.el("li", {"class": "msg " + kind}, m.el("div", {"class": "who"}, who), body));
      return body;
    };
    m.on(input, "keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); form.requestSubmit(); }
    });
    m.on(form, "submit", async (e) => {
      e.preventDefault();
      const text = input.value.trim();
      if (!text || send.disabled) return;
      send.disabled = true;
      bubble("you", text, "user");
      input.value = "";
      const res = await call(ctx, "POST", "/admin/agents/" + enc(name) + "/chat",
        {text, conversation});
      if (!v.alive()) return;
      if (res.status === 200) {  // a command's answer (/help, /new ...)
        bubble(name, res.body.answer, res.body.failed ? "assistant bad" : "assistant");
        send.disabled = false;
        return;
      }
      if (res.status !== 202) {
        bubble("error", problemOf(res), "assistant bad");
        send.disabled = false;
        return;
      }
      const out = bubble(name, "", "assistant live");
      const box = out.parentNode;
      const stop = ctx.follow(res.body.run_id, (ev) => {
        if (!v.alive()) { stop(); return; }
        if (ev.type === "message.delta") out.textContent += ev.text;
        else if (ev.type === "message.final") out.textContent = ev.text;
        else if (ev.type === "tool.start") {
          box.insertBefore(m.el("div", {"class": "tool-call"}, "⚙ " + ev.name), out);
        } else if (ev.type === "approval.request") {
          box.insertBefore(m.el("div", {"class": "tool-call"}, "⏸ waiting for approval of " +
            ev.name), out);
        } else if (ev.type === "run.error") {
          box.append(m.el("div", {"class": "tool-call bad"}, "Error: " + ev.message));
        } else if (ev.type === "run.end") {
          box.classList.remove("live");
          send.disabled = false;
          input.focus();
        }
      });
    });
    return m.el("section", {"class": "card", "aria-label": "Try " + name},
      m.el("h3", {}, "Try " + name), log, form);
  }

  function problemsList(m, name, problems) {
    const rel = (file) => {
      const f = String(file || "");
      const at = f.lastIndexOf("/" + name + "/");
      return at >= 0 ? f.slice(at + name.length + 2) : f.split("/").pop();
    };
    return m.el("ul", {"class": "pc-problems"}, (problems || []).map((p) => m.el("li", {},
      m.el("strong", {}, rel(p.file) + (p.line ? " line " + p.line : "")),
      p.field ? " (" + p.field + ")" : "", ": " + (p.message || ""))));
  }

  function agentsList(ctx, v) {
    const m = v.m;
    return (async () => {
      const res = await call(ctx, "GET", "/admin/agents?limit=1000");
      if (!v.alive()) return;
      if (!ok(res)) { v.say(problemOf(res), "error"); return; }
      const rows = (res.body.agents || []).map((a) => [
        m.button(a.name, () => go(ctx, v, a.name),
          {"class": "pc-link", "aria-label": "Open the agent " + a.name}),
        a.source === "api" ? "admin API" : "config files",
        a.valid ? m.el("span", {"class": "badge ok"}, "loads")
          : m.el("span", {"class": "badge bad"}, "does not load"),
        a.valid ? (a.model || "") : "",
        a.valid ? (a.description || "") : problemsList(m, a.name, a.problems),
      ]);
      const parts = [m.el("p", {}, (res.body.total || 0) + " agents.")];
      if (m.may("admin")) {
        const name = m.input({name: "name", autocomplete: "off", pattern: "[a-z0-9][a-z0-9_-]*",
          maxlength: "64"});
        const f = m.form("New agent", m.field("New agent's name", name,
          "a-z, 0-9, '-' and '_'"),
          m.el("button", {type: "submit", "class": "primary"}, "Write a new agent"));
        m.on(f, "submit", async (e) => {
          e.preventDefault();
          const n = name.value.trim();
          if (!/^[a-z0-9][a-z0-9_-]{0,63}$/.test(n)) {
            v.say("Agent names use a-z, 0-9, '-' and '_' (at most 64, starting with a letter " +
              "or digit).", "error");
            return;
          }
          const there = await call(ctx, "GET", "/admin/agents/" + enc(n));
          if (!v.alive()) return;
          if (there.status !== 404) {
            go(ctx, v, n);  // it exists: its files, not a blank one that would replace them
            return;
          }
          v.open = n;
          v.fresh = true;
          v.redraw();
        });
        parts.push(f);
      }
      parts.push(m.table(["Agent", "Defined by", "Loads", "Model", "Description or problems"],
        rows, "Agents", "No agents."));
      fill(v.body, ...parts);
    })();
  }

  // open an agent (or the list): through the address when the shell passes it (#/agents/<name>:
  // a link, the back button), else in place
  function go(ctx, v, name) {
    v.fresh = false;
    const target = name ? "#/agents/" + enc(name) : "#/agents";
    if (typeof ctx.param === "string" && location.hash !== target) {
      location.hash = target;
      return;
    }
    v.open = name;
    v.redraw();
  }

  const NEW_YAML = "description: A new agent.\nmodel: default\ninstructions: instructions.md\n" +
    "tools: [current_time]\n";

  async function agentView(ctx, v) {
    const m = v.m;
    const name = v.open;
    let view;
    if (v.fresh) {
      view = {name, source: "api", valid: false, agent_yaml: NEW_YAML,
        files: {"instructions.md": "You are a helpful assistant.\n"}, problems: []};
    } else {
      const res = await call(ctx, "GET", "/admin/agents/" + enc(name));
      if (!v.alive()) return;
      if (!ok(res)) {
        v.say(problemOf(res), "error");
        fill(v.body, m.button("← All agents", () => go(ctx, v, null)));
        return;
      }
      view = res.body;
    }
    const admin = m.may("admin");
    const back = m.button("← All agents", () => go(ctx, v, null));
    const errors = m.el("div", {"class": "pc-errors", "aria-live": "assertive"});
    const head = [
      back,
      m.el("h3", {tabindex: "-1", "class": "pc-agent-heading"},
        v.fresh ? "New agent " + name : "Agent " + name),
      m.el("p", {}, v.fresh ? "Not saved yet." :
        (view.source === "api" ? "Deployed through the admin API" : "Defined in the config " +
          "directory") + ". " + (view.valid ? "It loads." : "It does not load."),
        view.path ? m.el("br", {}) : null, view.path ? "Folder: " : null,
        view.path ? m.el("code", {}, view.path) : null),
    ];
    if (!v.fresh && !view.valid && view.problems) head.push(problemsList(m, name, view.problems));
    if (!v.fresh && view.source !== "api" && admin) {
      head.push(m.el("p", {"class": "pc-hint"}, "Saving here puts a copy in the gateway's " +
        "data directory that overrides the config directory's files (top-level files only)."));
    }
    const editors = [];
    const area = (label, text, filename) => {
      const t = m.el("textarea", {rows: String(Math.min(24, Math.max(6,
        String(text || "").split("\n").length + 1))), spellcheck: "false", name: filename,
        "class": "code"});
      t.value = text || "";
      t.readOnly = !admin;
      t.style.width = "100%";
      t.style.boxSizing = "border-box";
      t.style.fontFamily = "monospace";
      editors.push({filename, t});
      return m.field(label, t);
    };
    const form = m.el("form", {"aria-label": "Agent " + name + "'s files"},
      area("agent.yaml", view.agent_yaml, "agent.yaml"),
      Object.keys(view.files || {}).sort().map((f) => area(f, view.files[f], f)));
    const parts = [...head, errors, form];
    if (admin) {
      const save = m.el("button", {type: "submit", "class": "primary"},
        v.fresh ? "Create agent" : "Save");
      const actions = m.el("div", {"class": "pc-actions"}, save);
      form.append(actions);
      m.on(form, "submit", async (e) => {
        e.preventDefault();
        save.disabled = true;
        const files = {};
        let yaml = "";
        for (const {filename, t} of editors) {
          if (filename === "agent.yaml") yaml = t.value; else files[filename] = t.value;
        }
        const res = await call(ctx, "PUT", "/admin/agents/" + enc(name),
          {agent_yaml: yaml, files});
        save.disabled = false;
        if (!v.alive()) return;
        if (ok(res)) {
          fill(errors);
          ctx.toast((res.status === 201 ? "Created " : "Saved ") + name + ".", "ok");
          v.fresh = false;
          v.say("Saved " + name + (res.body && res.body.valid ? "; it loads." : "."), "ok");
          await v.redraw();
          return;
        }
        const problems = res.body && res.body.problems;
        fill(errors, m.el("div", {role: "alert", "class": "pc-msg error problems"},
          m.el("p", {}, "Not saved: " + problemOf(res) + "."),
          problems ? problemsList(m, name, problems) : null));
        ctx.toast("Not saved: " + problemOf(res), "error");
      });
      if (!v.fresh && view.source === "api") {
        actions.append(" ", confirmInPlace(m, "Delete", "Delete the agent " + name + "?",
          async () => {
            const res = await call(ctx, "DELETE", "/admin/agents/" + enc(name));
            if (!v.alive()) return;
            if (ok(res)) {
              ctx.toast("Deleted " + name + ".", "ok");
              v.say("Deleted " + name + ".", "ok");
              v.open = null;
              if (typeof ctx.param === "string" && history.replaceState) {
                history.replaceState(null, "", "#/agents");  // (no page drawn again)
              }
            } else {
              v.say("Not deleted: " + problemOf(res), "error");
            }
            await v.redraw();
          }));
      }
    }
    if (!v.fresh && m.may("operator")) parts.push(testChat(ctx, v, name));
    if (!v.fresh) {
      parts.push(m.el("p", {}, m.el("a", {href: "/agents/" + enc(name) +
        "/.well-known/agent.json"}, "Its A2A agent card")));
    }
    fill(v.body, ...parts);
    const h = v.body.querySelector(".pc-agent-heading");
    if (h && !v.body.contains(document.activeElement)) h.focus();  // keyboard: start here
  }

  PC.register("agents", {
    title: "Agents",
    role: "viewer",
    render(el, ctx) {
      return page(el, ctx, "Agents", (v) => {
        if (v.open === undefined) v.open = ctx.param || null;  // #/agents/<name> opens one
        return v.open ? agentView(ctx, v) : agentsList(ctx, v);
      });
    },
  });

  // ---- datasets -------------------------------------------------------------------------------

  PC.register("datasets", {
    title: "Datasets",
    role: "viewer",
    render(el, ctx) {
      return page(el, ctx, "Datasets", async (v) => {
        const m = v.m;
        const res = await call(ctx, "GET", "/admin/datasets");
        if (!v.alive()) return;
        if (res.status === 404 || res.status === 405) {
          fill(v.body, m.el("p", {}, "This gateway has no admin endpoint for " +
            "datasets yet: they are listed in pluto.yaml (data.datasets), and the agents' " +
            "data tools (list_datasets, describe_dataset) show them in a chat."));
          return;
        }
        if (!ok(res)) { v.say(problemOf(res), "error"); return; }
        const preview = m.el("div", {"class": "pc-preview", "aria-live": "polite"});
        const rows = (res.body.datasets || []).map((d) => [
          d.name, d.rows === undefined ? "" : String(d.rows),
          (d.columns || []).map((c) => (typeof c === "string" ? c : c.name)).join(", "),
          when(d.updated_at),
          m.button("Preview", async () => {
            const p = await call(ctx, "GET", "/admin/datasets/" + enc(d.name) +
              "/preview?limit=20");
            if (!v.alive()) return;
            if (!ok(p)) { v.say(problemOf(p), "error"); return; }
            const cols = (p.body.columns || []).map((c) => (typeof c === "string" ? c : c.name));
            fill(preview, m.el("h3", {}, "First rows of " + d.name),
              m.table(cols, (p.body.rows || []).map((r) => r.map((x) =>
                x === null ? "" : String(x))), "First rows of " + d.name));
          }, {"aria-label": "Preview " + d.name}),
        ]);
        fill(v.body, m.table(["Dataset", "Rows", "Columns", "Updated", "Actions"], rows,
          "Datasets", "No datasets."),
          preview);
      });
    },
  });

  // ---- schedules ------------------------------------------------------------------------------

  PC.register("schedules", {
    title: "Schedules",
    role: "operator",
    render(el, ctx) {
      let all = false;
      return page(el, ctx, "Schedules", async (v) => {
        const m = v.m;
        const res = await call(ctx, "GET", "/admin/schedules" + (all ? "?all=1" : ""));
        if (!v.alive()) return;
        if (!ok(res)) { v.say(problemOf(res), "error"); return; }
        const showAll = m.el("input", {type: "checkbox"});
        showAll.checked = all;
        m.on(showAll, "change", () => { all = showAll.checked; v.redraw(); });
        const toggle = m.el("label", {}, showAll, " Show finished schedules too");
        const rows = (res.body.schedules || []).map((s) => [
          s.agent, s.provider + ":" + s.chat_id + (s.thread_id ? " (thread " + s.thread_id +
            ")" : ""),
          s.describe || (s.kind + " " + s.expr), s.active ? when(s.next_due) : "finished",
          m.el("span", {"class": "pc-prompt"}, String(s.prompt || "").slice(0, 200)),
          s.source + (s.created_by ? " (" + s.created_by + ")" : ""),
          m.el("span", {"class": "pc-actions"},
            s.active ? m.button("Run now", async () => {
              const r = await call(ctx, "POST", "/admin/schedules/" + enc(s.id) + "/run");
              if (ok(r)) ctx.toast("The schedule " + s.id + " runs now.", "ok");
              else v.say(problemOf(r), "error");
              v.redraw();
            }, {"aria-label": "Run the schedule " + s.id + " now"}) : null, " ",
            m.button("History", () => showHistory(s), {"aria-label": "History of " + s.id}), " ",
            confirmInPlace(m, "Cancel", "Cancel the schedule " + s.id + " and its history?" +
              (s.source === "file" ? " (It is in schedules.yaml: it comes back when the file " +
                "is read again; remove it there.)" : ""),
              async () => {
                const r = await call(ctx, "DELETE", "/admin/schedules/" + enc(s.id));
                if (ok(r)) { ctx.toast("Cancelled " + s.id + ".", "ok"); v.say("", ""); }
                else v.say(problemOf(r), "error");
                v.redraw();
              })),
        ]);
        const past = m.el("div", {"class": "pc-history", "aria-live": "polite"});
        const showHistory = async (s) => {
          const r = await call(ctx, "GET", "/admin/schedules/" + enc(s.id) + "/history?limit=20");
          if (!v.alive()) return;
          if (!ok(r)) { v.say(problemOf(r), "error"); return; }
          fill(past, m.el("h3", {}, "Last firings of " + s.id),
            m.table(["Due", "Fired", "Outcome", "Run", "Detail"], (r.body.firings || []).map(
              (f) => [when(f.due), when(f.fired_at), f.outcome, f.run_id || "", f.detail || ""]),
            "Firings of " + s.id, "It has not fired yet."));
        };
        fill(v.body, toggle,
          rows.length ? m.el("p", {}, "Next firing: " + when(res.body.next_firing) + ".") : null,
          m.table(["Agent", "To", "When", "Next", "Prompt", "Made by", "Actions"], rows,
            "Schedules", "No schedules."),
          m.el("p", {"class": "pc-hint"}, "A schedule cannot be paused here: cancel removes " +
            "it."), past, await newSchedule(ctx, v));
      });
    },
  });

  const WHEN_HINT = {every: "e.g. 30m, 2h, 1d", cron: "e.g. 0 9 * * 1-5 (minute hour day " +
    "month weekday)", at: "e.g. 2026-12-01 09:00"};

  async function newSchedule(ctx, v) {
    const m = v.m;
    const agents = await call(ctx, "GET", "/admin/agents?limit=1000");
    const names = ok(agents) ? (agents.body.agents || []).map((a) => a.name) : [];
    const agent = m.select(names, names.indexOf("default") >= 0 ? "default" : undefined,
      {name: "agent"});
    const to = m.input({name: "to", autocomplete: "off", spellcheck: "false"});
    const kind = m.select(["every", "cron", "at"], "every", {name: "kind"});
    const expr = m.input({name: "expr", autocomplete: "off", spellcheck: "false"});
    const tz = m.input({name: "tz", autocomplete: "off", placeholder: "the gateway's"});
    const group = m.el("input", {type: "checkbox", name: "group"});
    const prompt = m.el("textarea", {name: "prompt", rows: "3"});
    prompt.style.width = "100%";
    prompt.style.boxSizing = "border-box";
    const whenField = m.field("When", expr, WHEN_HINT.every);
    m.on(kind, "change", () => {
      const hint = whenField.querySelector("small");
      if (hint) hint.textContent = WHEN_HINT[kind.value];
    });
    const f = m.form("New schedule", m.field("Agent", agent),
      m.field("To", to, "PROVIDER:CHAT, e.g. telegram:12345"), m.field("Repeat", kind),
      whenField, m.field("Time zone", tz, "e.g. Europe/Paris"),
      m.el("label", {}, group, " A group chat"));
    const promptBox = m.field("What the agent is asked each time", prompt);
    promptBox.style.flexBasis = "100%";
    f.append(promptBox, m.el("button", {type: "submit", "class": "primary"}, "Add schedule"));
    m.on(f, "submit", async (e) => {
      e.preventDefault();
      const body = {agent: agent.value, to: to.value.trim(), prompt: prompt.value};
      body[kind.value] = expr.value.trim();
      if (tz.value.trim()) body.tz = tz.value.trim();
      if (group.checked) body.group = true;
      const r = await call(ctx, "POST", "/admin/schedules", body);
      if (!v.alive()) return;
      if (ok(r)) {
        const made = r.body.schedule || {};
        v.say("Added the schedule " + made.id + ": " + (made.describe || "") + ".", "ok");
        ctx.toast("Schedule added.", "ok");
        v.redraw();
      } else {
        v.say("Not added: " + problemOf(r), "error");
      }
    });
    return m.el("section", {"aria-labelledby": "pc-new-schedule"},
      m.el("h3", {id: "pc-new-schedule"}, "New schedule"), f);
  }

  // ---- pairing --------------------------------------------------------------------------------

  PC.register("pairing", {
    title: "Pairing",
    role: "operator",
    render(el, ctx) {
      return page(el, ctx, "Pairing requests", async (v) => {
        const m = v.m;
        const res = await call(ctx, "GET", "/admin/pairing");
        if (!v.alive()) return;
        if (!ok(res)) { v.say(problemOf(res), "error"); return; }
        const approve = async (code) => {
          const r = await call(ctx, "POST", "/admin/pairing/approve", {code});
          if (!v.alive()) return;
          if (ok(r)) {
            const a = r.body.approved || {};
            v.say("Approved " + (a.user_name || a.user_id || "") + " (" + (a.provider || "") +
              ").", "ok");
            ctx.toast("Approved.", "ok");
          } else {
            v.say("Not approved: " + problemOf(r), "error");
          }
          v.redraw();
        };
        const code = m.input({name: "code", autocomplete: "off", spellcheck: "false"});
        const f = m.form("Approve a code", m.field("Pairing code", code,
          "the code the person was given, e.g. ABCD-2345"),
          m.el("button", {type: "submit", "class": "primary"}, "Approve"));
        m.on(f, "submit", (e) => {
          e.preventDefault();
          if (code.value.trim()) approve(code.value.trim());
        });
        const pending = (res.body.pending || []).map((p) => [
          p.code, p.provider, (p.user_name ? p.user_name + " " : "") + "(" + p.user_id + ")",
          p.chat_id, when(p.created_at), when(p.expires_at),
          m.button("Approve", () => approve(p.code),
            {"aria-label": "Approve " + (p.user_name || p.user_id) + " on " + p.provider}),
        ]);
        const approved = (res.body.approved || []).map((a) => [
          a.provider, (a.user_name ? a.user_name + " " : "") + "(" + a.user_id + ")",
          when(a.approved_at), a.approved_by,
          confirmInPlace(m, "Revoke", "Revoke " + (a.user_name || a.user_id) + "?", async () => {
            const r = await call(ctx, "DELETE", "/admin/pairing/" + enc(a.provider) + "/" +
              enc(a.user_id));
            if (ok(r)) { ctx.toast("Revoked.", "ok"); v.say("", ""); }
            else v.say(problemOf(r), "error");
            v.redraw();
          }),
        ]);
        fill(v.body, f,
          m.el("h3", {}, "Waiting"),
          m.table(["Code", "Platform", "Person", "Chat", "Asked", "Expires", "Actions"], pending,
            "Waiting pairing requests", "No pairing requests are waiting."),
          m.el("h3", {}, "Approved"),
          m.table(["Platform", "Person", "Approved", "By", "Actions"], approved,
            "Approved people", "Nobody is approved yet."));
      });
    },
  });

  // ---- accounts -------------------------------------------------------------------------------

  function ownerOnly(v) {
    if (v.m.may("owner")) return false;
    fill(v.body, v.m.el("p", {}, "Only an owner manages accounts and keys."));
    return true;
  }

  PC.register("accounts", {
    title: "Accounts",
    role: "owner",
    render(el, ctx) {
      return page(el, ctx, "Accounts", async (v) => {
        const m = v.m;
        if (ownerOnly(v)) return;
        const res = await call(ctx, "GET", "/admin/accounts");
        if (!v.alive()) return;
        if (!ok(res)) { v.say(problemOf(res), "error"); return; }
        const user = m.input({name: "username", autocomplete: "off", spellcheck: "false"});
        const role = m.select(ROLES, "viewer", {name: "role"});
        const pass = m.input({type: "password", name: "password", autocomplete: "new-password"});
        const add = m.form("Add an account", m.field("Username", user), m.field("Role", role),
          m.field("Password", pass),
          m.el("button", {type: "submit", "class": "primary"}, "Add account"));
        m.on(add, "submit", async (e) => {
          e.preventDefault();
          const r = await call(ctx, "POST", "/admin/accounts",
            {username: user.value.trim(), role: role.value, password: pass.value});
          if (!v.alive()) return;
          if (ok(r)) {
            pass.value = "";
            v.say((r.status === 201 ? "Added " : "Updated ") + r.body.username + " (" +
              r.body.role + ").", "ok");
            ctx.toast("Account " + r.body.username + " saved.", "ok");
            v.redraw();
          } else {
            v.say("Not added: " + problemOf(r), "error");
          }
        });
        const rows = (res.body.accounts || []).map((a) => {
          const pick = m.select(ROLES, a.role, {"aria-label": "Role of " + a.username});
          const change = m.button("Change role", async () => {
            const r = await call(ctx, "PUT", "/admin/accounts/" + enc(a.username),
              {role: pick.value});
            if (!v.alive()) return;
            if (ok(r)) {
              v.say(a.username + " is now " + r.body.role + ".", "ok");
              ctx.toast("Role changed.", "ok");
              v.redraw();
            } else {
              pick.value = a.role;
              v.say("Not changed: " + problemOf(r), "error");
            }
          }, {"aria-label": "Change the role of " + a.username});
          const remove = confirmInPlace(m, "Remove", "Remove the account " + a.username + "?",
            async () => {
              const r = await call(ctx, "DELETE", "/admin/accounts/" + enc(a.username));
              if (!v.alive()) return;
              if (ok(r)) {
                v.say("Removed " + a.username + ".", "ok");
                ctx.toast("Removed.", "ok");
              } else {
                v.say("Not removed: " + problemOf(r), "error");
              }
              v.redraw();
            });
          return [a.username + (ctx.me && ctx.me.user === a.username ? " (you)" : ""),
            m.el("span", {"class": "pc-actions"}, pick, " ", change),
            a.source || "", when(a.created_at), a.disabled ? "disabled" : "active", remove];
        });
        fill(v.body, add, m.el("h3", {}, "Who can sign in"),
          m.table(["User", "Role", "Source", "Created", "State", "Actions"], rows,
            "Accounts"));
      });
    },
  });

  // ---- API keys -------------------------------------------------------------------------------

  PC.register("keys", {
    title: "API keys",
    role: "owner",
    render(el, ctx) {
      let made = null;  // the key just made: shown once, gone with the page
      return page(el, ctx, "API keys", async (v) => {
        const m = v.m;
        if (ownerOnly(v)) return;
        const res = await call(ctx, "GET", "/admin/keys");
        if (!v.alive()) return;
        if (!ok(res)) { v.say(problemOf(res), "error"); return; }
        const name = m.input({name: "name", autocomplete: "off", spellcheck: "false"});
        const role = m.select(ROLES, "viewer", {name: "role"});
        const f = m.form("Make a key", m.field("Key name", name, "who or what uses it"),
          m.field("Role", role), m.el("button", {type: "submit", "class": "primary"}, "Make key"));
        m.on(f, "submit", async (e) => {
          e.preventDefault();
          const r = await call(ctx, "POST", "/admin/keys", {name: name.value.trim(),
            role: role.value});
          if (!v.alive()) return;
          if (ok(r)) { made = r.body; v.say("", ""); v.redraw(); }
          else v.say("No key made: " + problemOf(r), "error");
        });
        const parts = [f];
        if (made) {
          const secret = m.el("input", {type: "text", "class": "pc-secret", spellcheck: "false"});
          secret.value = made.key;
          secret.readOnly = true;
          secret.style.fontFamily = "monospace";
          secret.style.width = "100%";
          const copy = m.button("Copy", async () => {
            secret.select();
            let copied = false;
            try {
              await navigator.clipboard.writeText(made.key);
              copied = true;
            } catch (err) {
              try { copied = document.execCommand("copy"); } catch (err2) { copied = false; }
            }
            ctx.toast(copied ? "Copied." : "Select the key and copy it.", copied ? "ok" : "error");
          }, {"aria-label": "Copy the key to the clipboard"});
          const done = m.button("I have kept it", () => { made = null; v.redraw(); });
          const box = m.el("section", {"class": "pc-once", "aria-labelledby": "pc-once-h"},
            m.el("h3", {id: "pc-once-h"}, "The key " + made.name + " (" + made.role + ")"),
            m.el("p", {}, "Shown once: copy it now; it cannot be read again."),
            m.field("The new key", secret), m.el("div", {"class": "pc-actions"}, copy, " ", done));
          parts.push(box);
          setTimeout(() => secret.focus(), 0);
        }
        const rows = (res.body.keys || []).map((k) => [
          k.name, k.id, k.role, k.created_by, when(k.created_at),
          k.revoked_at ? "revoked " + when(k.revoked_at) : "live",
          k.revoked_at ? "" : confirmInPlace(m, "Revoke", "Revoke the key " + k.name + "?",
            async () => {
              const r = await call(ctx, "DELETE", "/admin/keys/" + enc(k.id));
              if (!v.alive()) return;
              if (ok(r)) { v.say("Revoked " + k.name + ".", "ok"); ctx.toast("Revoked.", "ok"); }
              else v.say("Not revoked: " + problemOf(r), "error");
              v.redraw();
            }),
        ]);
        parts.push(m.el("h3", {}, "Keys"), m.table(["Name", "Id", "Role", "Made by", "Made",
          "State", "Actions"], rows, "API keys", "No keys yet."));
        fill(v.body, ...parts);
      });
    },
  });

  // ---- audit log ------------------------------------------------------------------------------

  PC.register("audit", {
    title: "Audit log",
    role: "viewer",
    render(el, ctx) {
      let actor = "";
      let pages = [null];  // the 'before' id of each page shown so far
      return page(el, ctx, "Audit log", async (v) => {
        const m = v.m;
        const before = pages[pages.length - 1];
        const q = "?limit=50" + (actor ? "&actor=" + enc(actor) : "") +
          (before ? "&before=" + enc(before) : "");
        const res = await call(ctx, "GET", "/admin/audit" + q);
        if (!v.alive()) return;
        if (!ok(res)) { v.say(problemOf(res), "error"); return; }
        const who = m.input({type: "search", name: "actor", autocomplete: "off"});
        who.value = actor;
        const f = m.form("Filter the audit log", m.field("Actor", who, "an account or key:NAME"),
          m.el("button", {type: "submit", "class": "primary"}, "Filter"));
        m.on(f, "submit", (e) => {
          e.preventDefault();
          actor = who.value.trim();
          pages = [null];
          v.redraw();
        });
        if (actor) {
          f.append(m.button("Show everyone", () => { actor = ""; pages = [null]; v.redraw(); }));
        }
        const entries = res.body.entries || [];
        const rows = entries.map((e) => [
          when(e.at), e.actor + (e.role ? " (" + e.role + ")" : ""), e.action, e.target || "",
          e.diff ? m.el("details", {}, m.el("summary", {}, "Show the change"),
            m.el("pre", {"class": "diff"}, String(e.diff))) : "",
        ]);
        const nav = m.el("div", {"class": "pc-actions"});
        if (pages.length > 1) nav.append(m.button("Newer", () => { pages.pop(); v.redraw(); }));
        if (entries.length === 50) {
          nav.append(" ", m.button("Older", () => {
            pages.push(entries[entries.length - 1].id);
            v.redraw();
          }));
        }
        fill(v.body, f,
          m.el("p", {}, m.el("a", {href: "/admin/audit.csv", download: "pluto-audit.csv"},
            "Download the whole log (CSV)")),
          m.table(["When", "Who", "What", "Target", "Change"], rows, "Audit log",
            actor ? "Nothing by " + actor + "." : "No changes yet."),
          nav);
      });
    },
  });
})();
