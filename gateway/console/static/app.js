/* Pluto console: the shell (docs/console.md).
 *
 * window.PlutoConsole.register(id, {title, role, render}) adds a page at #/<id>; render(el, ctx)
 * draws into el and may return a cleanup function. ctx: api, me, follow, h, toast, table.
 * Data is only ever put in the page as text (h() and textContent), never as markup.
 */
(function () {
  "use strict";

  var ROLES = ["viewer", "operator", "admin", "owner"];
  var SSE_EVENTS = ["run.start", "message.delta", "tool.start", "tool.progress", "tool.end",
    "message.final", "run.end", "run.error", "approval.request", "approval.decision"];
  var pages = {};
  var order = [];
  var state = {me: null, csrf: "", cleanup: null, started: false};

  function rank(role) { return ROLES.indexOf(role); }

  // an element: h("p", {class: "x", onclick: fn}, "text", child, [more]); text only
  function h(tag, attrs) {
    var svg = tag.indexOf("svg:") === 0;
    var el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
      : document.createElement(tag);
    var a = attrs || {};
    Object.keys(a).forEach(function (k) {
      var v = a[k];
      if (v === null || v === undefined || v === false) return;
      if (k.slice(0, 2) === "on" && typeof v === "function") {
        el.addEventListener(k.slice(2), v);
      } else if (k === "text") {
        el.textContent = String(v);
      } else if (k === "value" && !svg) {
        el.value = v;
      } else if (k === "checked" || k === "disabled" || k === "readOnly" || k === "hidden") {
        el[k] = !!v;
      } else if (k === "style") {
        throw new Error("no inline style (CSP): use a class");
      } else {
        el.setAttribute(k, v === true ? "" : String(v));
      }
    });
    function add(c) {
      if (c === null || c === undefined || c === false) return;
      if (Array.isArray(c)) { c.forEach(add); return; }
      el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    for (var i = 2; i < arguments.length; i++) add(arguments[i]);
    return el;
  }

  function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); return el; }

  function toast(text, kind) {
    var box = document.querySelector(".toasts");
    var t = h("div", {class: "toast " + (kind || "info")}, String(text));
    box.appendChild(t);
    setTimeout(function () { if (t.parentNode) t.parentNode.removeChild(t); },
      kind === "error" ? 9000 : 5000);
  }

  // columns: [{key, label, render?(row) -> node|text, num?}]; rows: objects
  function table(columns, rows, opts) {
    var o = opts || {};
    if (!rows || !rows.length) return h("p", {class: "empty"}, o.empty || "Nothing yet.");
    var head = h("tr", null, columns.map(function (c) {
      return h("th", {scope: "col", class: c.num ? "num" : null}, c.label);
    }));
    var body = rows.map(function (r) {
      return h("tr", null, columns.map(function (c, i) {
        var v = c.render ? c.render(r) : r[c.key];
        var cell = (v === null || v === undefined) ? "" : v;
        return h(i === 0 ? "th" : "td", {scope: i === 0 ? "row" : null,
          class: c.num ? "num" : null}, cell);
      }));
    });
    return h("div", {class: "table-wrap", tabindex: "0", role: "region",
      "aria-label": o.label || "Table"},
      h("table", null, o.caption ? h("caption", null, o.caption) : null,
        h("thead", null, head), h("tbody", null, body)));
  }

  function api(method, path, body) {
    var headers = {"Accept": "application/json"};
    if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = state.csrf;
    var init = {method: method, headers: headers, credentials: "same-origin"};
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(path, init).then(function (r) {
      var type = r.headers.get("Content-Type") || "";
      var read = type.indexOf("application/json") === 0 ? r.json() : r.text();
      return read.then(function (b) {
        if (r.status === 401 && path.indexOf("/console/login") !== 0) signIn(null);
        return {status: r.status, body: b};
      });
    }, function (e) {
      toast("The gateway cannot be reached: " + e.message, "error");
      return {status: 0, body: {error: String(e.message)}};
    });
  }

  // a run's events as they happen; stop() ends it (it also ends by itself at run.end)
  function follow(runId, onEvent) {
    var src = new EventSource("/admin/runs/" + encodeURIComponent(runId) + "/events");
    var done = false;
    function stop() { if (!done) { done = true; src.close(); } }
    SSE_EVENTS.forEach(function (type) {
      src.addEventListener(type, function (m) {
        var ev;
        try { ev = JSON.parse(m.data); } catch (e) { return; }
        if (done) return;
        onEvent(ev);
        if (type === "run.end") stop();
      });
    });
    src.onerror = function () {
      if (src.readyState === EventSource.CLOSED) stop();
    };
    return stop;
  }

  function ctx() {
    return {api: api, me: state.me, follow: follow, h: h, toast: toast, table: table,
      clear: clear, may: function (role) { return !!state.me && rank(state.me.role) >= rank(role); },
      go: function (id) { location.hash = "#/" + id; }};
  }

  function register(id, spec) {
    if (!/^[a-z][a-z0-9-]{0,40}$/.test(id) || !spec || typeof spec.render !== "function") {
      throw new Error("PlutoConsole.register: a page needs an id and a render function");
    }
    if (!pages[id]) order.push(id);
    pages[id] = {id: id, title: spec.title || id, role: ROLES.indexOf(spec.role) >= 0
      ? spec.role : "viewer", render: spec.render};
    if (state.me) { drawNav(); }
  }

  function visible(id) {
    var p = pages[id];
    return p && state.me && rank(state.me.role) >= rank(p.role);
  }

  function current() {
    var m = /^#\/([a-z][a-z0-9-]*)(?:\/(.*))?$/.exec(location.hash);
    return {id: m ? m[1] : "overview", rest: m && m[2] ? decodeURIComponent(m[2]) : ""};
  }

  function drawNav() {
    var ul = clear(document.querySelector(".nav ul"));
    var here = current().id;
    order.forEach(function (id) {
      if (!visible(id)) return;
      ul.appendChild(h("li", null, h("a", {href: "#/" + id,
        "aria-current": id === here ? "page" : null}, pages[id].title)));
    });
  }

  function show() {
    var main = document.getElementById("main");
    if (state.cleanup) { try { state.cleanup(); } catch (e) { /* the old page is gone */ } }
    state.cleanup = null;
    clear(main);
    var where = current();
    var page = pages[where.id];
    drawNav();
    closeMenu();
    if (!page) {
      main.appendChild(h("h2", null, "No such page"));
      main.appendChild(h("p", null, h("a", {href: "#/overview"}, "Go to the overview")));
      return;
    }
    if (!visible(where.id)) {
      main.appendChild(h("h2", null, page.title));
      main.appendChild(h("p", {class: "refused"}, "Your role (" + state.me.role +
        ") cannot see this page; it takes " + page.role + " or above."));
      return;
    }
    document.title = page.title + " · Pluto console";
    var c = ctx();
    c.param = where.rest;
    try {
      var out = page.render(main, c);
      if (typeof out === "function") state.cleanup = out;
    } catch (e) {
      main.appendChild(h("p", {class: "error"}, "This page failed: " + e.message));
    }
  }

  function closeMenu() {
    var b = document.querySelector(".menu");
    if (b.getAttribute("aria-expanded") === "true") {
      b.setAttribute("aria-expanded", "false");
      document.querySelector(".nav").classList.remove("open");
    }
  }

  function started(me) {
    state.me = {user: me.user, role: me.role, can: me.can || {}};
    state.csrf = me.csrf || "";
    document.querySelector(".who-name").textContent = me.user;
    document.querySelector(".who-role").textContent = me.role;
    document.querySelector(".who").hidden = false;
    document.querySelector(".nav").hidden = false;
    document.querySelector(".menu").hidden = false;
    if (!state.started) {
      state.started = true;
      window.addEventListener("hashchange", show);
    }
    show();
  }

  function signIn(oidcLabel) {
    state.me = null;
    state.csrf = "";
    if (state.cleanup) { try { state.cleanup(); } catch (e) { /* gone */ } state.cleanup = null; }
    document.querySelector(".who").hidden = true;
    document.querySelector(".nav").hidden = true;
    document.querySelector(".menu").hidden = true;
    var main = clear(document.getElementById("main"));
    var problem = h("p", {class: "error", role: "alert", hidden: true});
    var name = h("input", {id: "signin-name", name: "username", autocomplete: "username",
      required: true});
    var pass = h("input", {id: "signin-password", name: "password", type: "password",
      autocomplete: "current-password", required: true});
    var form = h("form", {class: "signin card", novalidate: true},
      h("h2", null, "Sign in"),
      h("label", {for: "signin-name"}, "Name"), name,
      h("label", {for: "signin-password"}, "Password"), pass,
      problem,
      h("button", {type: "submit", class: "primary"}, "Sign in"));
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      problem.hidden = true;
      api("POST", "/console/login", {username: name.value, password: pass.value})
        .then(function (r) {
          if (r.status === 200) {
            pass.value = "";
            return api("GET", "/console/me").then(function (me) {
              if (me.status === 200) started(me.body);
            });
          }
          problem.textContent = (r.body && r.body.error) || ("Sign-in failed (" + r.status + ")");
          problem.hidden = false;
          pass.focus();
        });
    });
    main.appendChild(form);
    var sso = function (label) {
      form.appendChild(h("p", {class: "or"}, "or"));
      form.appendChild(h("a", {class: "button sso", href: "/console/oidc/login"}, label));
    };
    if (oidcLabel) sso(oidcLabel);
    else if (oidcLabel === null) {
      fetch("/console/me", {credentials: "same-origin"}).then(function (r) { return r.json(); })
        .then(function (b) { if (b && b.oidc) sso(b.oidc); }, function () {});
    }
    name.focus();
  }

  function boot() {
    var menu = document.querySelector(".menu");
    menu.addEventListener("click", function () {
      var open = menu.getAttribute("aria-expanded") !== "true";
      menu.setAttribute("aria-expanded", open ? "true" : "false");
      document.querySelector(".nav").classList.toggle("open", open);
    });
    document.querySelector(".signout").addEventListener("click", function () {
      api("POST", "/console/logout").then(function () { signIn(undefined); });
    });
    fetch("/console/me", {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) {
        return r.json().then(function (b) {
          if (r.status === 200) started(b); else signIn(b && b.oidc ? b.oidc : undefined);
        });
      }, function () {
        clear(document.getElementById("main")).appendChild(
          h("p", {class: "error"}, "The gateway cannot be reached."));
      });
  }

  window.PlutoConsole = {register: register, h: h, toast: toast, table: table, api: api,
    follow: follow, roles: ROLES.slice()};
  document.addEventListener("DOMContentLoaded", boot);
})();
