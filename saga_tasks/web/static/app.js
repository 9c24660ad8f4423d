// Operator buttons: POST to the JSON API with the token kept in this browser only.
(function () {
  const token = document.getElementById("token");
  token.value = sessionStorage.getItem("saga_token") || "";
  token.addEventListener("change", () => sessionStorage.setItem("saga_token", token.value));
  const result = document.getElementById("result");
  const val = (id) => (document.getElementById(id) || {}).value;

  async function post(url, body) {
    result.className = "";
    result.textContent = "…";
    const response = await fetch(url, {
      method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer " + token.value},
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

  document.querySelectorAll("button[data-action]").forEach((button) => {
    button.addEventListener("click", () => {
      const action = button.dataset.action;
      const ref = document.getElementById("saga-ref").dataset;
      const body = {reason: val("reason"), expect_version: Number(ref.sagaVersion)};
      if (action === "retry-step" || action === "skip-step") body.step = val("step");
      if (action === "resolve") body.status = val("resolution");
      post("/sagas/" + encodeURIComponent(ref.sagaId) + "/" + action, body);
    });
  });
  document.querySelectorAll("button[data-held]").forEach((button) => {
    button.addEventListener("click", () => {
      const body = {reason: val("reason")};
      const force = document.getElementById("force");
      if (force && force.checked && button.dataset.verb === "replay") {
        body.force = true;
        body.force_reason = val("force_reason");
      }
      post("/held/" + button.dataset.held + "/" + button.dataset.verb, body);
    });
  });
})();
