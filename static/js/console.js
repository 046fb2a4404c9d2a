// lorahub console: small progressive enhancements. No inline scripts (the CSP forbids them).
"use strict";

const csrfToken = () => document.querySelector('meta[name="csrf-token"]').content;

// Confirmation before destructive actions: any button with data-confirm.
function setupConfirm() {
  const dialog = document.getElementById("confirm-dialog");
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-confirm]");
    if (!button || button.dataset.confirmed === "1") return;
    event.preventDefault();
    document.getElementById("confirm-text").textContent = button.dataset.confirm;
    dialog.returnValue = "";
    dialog.showModal();
    dialog.addEventListener("close", function onClose() {
      dialog.removeEventListener("close", onClose);
      if (dialog.returnValue !== "ok") return;
      button.dataset.confirmed = "1";
      button.form.requestSubmit(button);
    });
  });
}

// Copy-to-clipboard buttons: data-copy names the element whose text is copied.
function setupCopy() {
  document.querySelectorAll("button[data-copy]").forEach((button) => {
    button.addEventListener("click", async () => {
      const text = document.getElementById(button.dataset.copy).textContent.trim();
      try {
        await navigator.clipboard.writeText(text);
      } catch (err) {
        const range = document.createRange();
        range.selectNodeContents(document.getElementById(button.dataset.copy));
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
      }
      const note = button.parentElement.querySelector("[data-copied]");
      if (note) note.hidden = false;
    });
  });
}

// Range sliders show their value (canary percent).
function setupSliders() {
  document.querySelectorAll("input[type=range][data-output]").forEach((input) => {
    const out = document.getElementById(input.dataset.output);
    const show = () => { out.textContent = `${input.value} %`; };
    input.addEventListener("input", show);
    show();
  });
}

// The tenant switcher keeps the section: /t/<old>/aliases/ -> /t/<new>/aliases/.
function setupTenantSwitch() {
  const form = document.querySelector("form[data-switch-tenant]");
  if (!form) return;
  form.querySelector("select").addEventListener("change", (event) => {
    const slug = event.target.value;
    const match = window.location.pathname.match(/^\/t\/[^/]+\/([a-z]+)\//);
    window.location.href = `/t/${slug}/${match ? match[1] : "adapters"}/`;
  });
}

// A version page whose validation is running reloads itself once it ends.
function setupVersionPolling() {
  const marker = document.querySelector("[data-poll-version]");
  if (!marker) return;
  const id = marker.dataset.pollVersion;
  const tick = async () => {
    const response = await fetch(`/api/versions/${id}`, { credentials: "same-origin" });
    if (response.ok && (await response.json()).state !== "validating") {
      window.location.reload();
      return;
    }
    setTimeout(tick, 1000);
  };
  setTimeout(tick, 1000);
}

const STATE_TEXT = {
  validating: "Validating…",
  pending_review: "Validated: pending review. A reviewer approves and signs it next.",
  approved: "Approved and signed.",
  rejected: "Rejected.",
};

// Upload: files go to the REST API with a progress bar, then the validation state is polled.
function setupUpload() {
  const form = document.getElementById("upload-form");
  if (!form) return;
  const input = document.getElementById("files");
  const zone = document.getElementById("dropzone");
  const list = document.getElementById("file-list");
  let chosen = [];
  const showFiles = () => {
    list.replaceChildren(...chosen.map((f) => {
      const li = document.createElement("li");
      li.textContent = `${f.name} (${(f.size / 1048576).toFixed(2)} MB)`;
      return li;
    }));
  };
  input.addEventListener("change", () => { chosen = Array.from(input.files); showFiles(); });
  ["dragenter", "dragover"].forEach((name) => zone.addEventListener(name, (e) => {
    e.preventDefault(); zone.classList.add("over");
  }));
  ["dragleave", "drop"].forEach((name) => zone.addEventListener(name, (e) => {
    e.preventDefault(); zone.classList.remove("over");
  }));
  zone.addEventListener("drop", (e) => { chosen = Array.from(e.dataTransfer.files); showFiles(); });

  const status = document.getElementById("upload-status");
  const bar = document.getElementById("upload-progress");
  const percent = document.getElementById("upload-percent");
  const state = document.getElementById("upload-state");
  const reason = document.getElementById("upload-reason");
  const link = document.getElementById("upload-link");
  const button = document.getElementById("upload-button");

  const finish = (text, detail) => {
    state.textContent = text;
    if (detail) { reason.textContent = detail; reason.hidden = false; }
    button.disabled = false;
  };
  const poll = async (version) => {
    const response = await fetch(`/api/versions/${version.id}`, { credentials: "same-origin" });
    const body = await response.json();
    state.dataset.state = body.state;
    if (body.state === "validating") {
      state.textContent = STATE_TEXT.validating;
      setTimeout(() => poll(version), 500);
      return;
    }
    finish(STATE_TEXT[body.state] || body.state, body.rejection_reason);
    const a = document.createElement("a");
    a.href = `${form.dataset.versionUrl}${body.id}/`;
    a.textContent = `Open ${body.adapter_id}@${body.version}`;
    link.replaceChildren(a);
    link.hidden = false;
  };

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const adapterId = form.elements.adapter_id.value.trim();
    if (!form.reportValidity()) return;
    if (!chosen.length) { status.hidden = false; finish("Choose the adapter's files first."); return; }
    const data = new FormData();
    chosen.forEach((f) => data.append("files", f, f.name));
    ["version", "base_model_revision", "training_data_summary"].forEach((name) => {
      const value = form.elements[name].value.trim();
      if (value) data.append(name, value);
    });
    status.hidden = false;
    reason.hidden = true;
    link.hidden = true;
    state.dataset.state = "uploading";
    state.textContent = "Uploading…";
    bar.value = 0;
    button.disabled = true;
    const xhr = new XMLHttpRequest();
    const tenant = encodeURIComponent(form.dataset.tenant);
    xhr.open("POST", `${form.dataset.api}${encodeURIComponent(adapterId)}/versions?tenant=${tenant}`);
    xhr.setRequestHeader("X-CSRFToken", csrfToken());
    xhr.upload.addEventListener("progress", (e) => {
      if (!e.lengthComputable) return;
      bar.value = Math.round((100 * e.loaded) / e.total);
      percent.textContent = `${bar.value} %`;
    });
    xhr.addEventListener("load", () => {
      let body = {};
      try { body = JSON.parse(xhr.responseText); } catch (err) { body = {}; }
      if (xhr.status === 202) {
        bar.value = 100;
        percent.textContent = "100 %";
        poll(body);
      } else {
        state.dataset.state = "refused";
        finish(`Refused (HTTP ${xhr.status}); nothing was stored.`, body.detail || xhr.statusText);
      }
    });
    xhr.addEventListener("error", () => finish("The upload failed: the connection broke. Try again."));
    xhr.send(data);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  setupConfirm();
  setupCopy();
  setupSliders();
  setupTenantSwitch();
  setupVersionPolling();
  setupUpload();
});
