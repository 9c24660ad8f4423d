// The token, kept in this tab's session storage only (gone when the tab closes). A page
// that came without data (#locked: no token, or one that may not read) is fetched again
// with it and its content swapped in; operator buttons POST to the JSON API with it.
(function () {
  const token = document.getElementById("token");
  token.value = sessionStorage.getItem("saga_token") || "";
  const val = (id) => (document.getElementById(id) || {}).value;
  const bearer = () => (token.value ? {"Authorization": "Bearer " + token.value} : {});

  async function unlock() {
    if (!document.getElementById("locked") || !token.value) return;
    const why = document.getElementById("locked-why");
    try {
      const response = await fetch(window.location.href, {headers: bearer(), cache: "no-store"});
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const main = page.querySelector("main");
      if (!main) throw new Error("HTTP " + response.status);
      document.querySelector("main").replaceWith(document.adoptNode(main));
      const nav = page.querySelector("header nav");
      if (nav) document.querySelector("header nav").replaceWith(document.adoptNode(nav));
      document.title = page.title;
    } catch (error) {
      if (why) why.textContent = "The page could not be fetched: " + error.message;
    }
  }

  async function post(url, body) {
    const result = document.getElementById("result") || document.getElementById("signal-result");
    result.className = "";
    result.textContent = "…";
    const response = await fetch(url, {
      method: "POST",
      headers: {"Content-Type": "application/json", ...bearer()},
      body: JSON.stringify(body),
    });
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      result.className = "error";
      result.textContent = (data.title || response.status) + ": " + (data.detail || "");
      return false;
    }
    result.className = "ok";
    result.textContent = "Done.";
    setTimeout(() => window.location.reload(), 400);
    return true;
  }

  token.addEventListener("change", () => {
    sessionStorage.setItem("saga_token", token.value);
    unlock();
  });

  // Delegated: the buttons may arrive with a page swapped in after load.
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action], button[data-held], button[data-signal]");
    if (!button) return;
    if (button.dataset.signal) {
      const ref = document.getElementById("saga-ref").dataset;
      let data;
      try {
        data = JSON.parse(val("signal-data") || "{}");
      } catch (error) {
        const result = document.getElementById("result");
        result.className = "error";
        result.textContent = "The data is not JSON: " + error.message;
        return;
      }
      const url = "/sagas/" + encodeURIComponent(ref.sagaId) + "/steps/" +
        encodeURIComponent(button.dataset.signal) + "/signal";
      post(url, {data: data, reason: val("signal-reason"), expect_version: Number(ref.sagaVersion)});
      return;
    }
    if (button.dataset.action) {
      const action = button.dataset.action;
      const ref = document.getElementById("saga-ref").dataset;
      const body = {reason: val("reason"), expect_version: Number(ref.sagaVersion)};
      if (action === "retry-step" || action === "skip-step") body.step = val(action + "-step");
      if (action === "resolve") body.status = val("resolution");
      post("/sagas/" + encodeURIComponent(ref.sagaId) + "/" + action, body);
      return;
    }
    const body = {reason: val("reason")};
    const force = document.getElementById("force");
    if (force && force.checked && button.dataset.verb === "replay") {
      body.force = true;
      body.force_reason = val("force_reason");
    }
    post("/held/" + button.dataset.held + "/" + button.dataset.verb, body);
  });

  if (document.getElementById("locked") && !token.value) token.focus();
  unlock();
})();
