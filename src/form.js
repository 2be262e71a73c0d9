/*
 * leadrouter form.js: progressive enhancement for lead forms. Include it with
 *   <script src="https://LEADROUTER/form.js" defer></script>
 * It takes over every <form data-leadrouter> whose action's path is /v1/leads
 * (on any origin, query string kept) and posts it as JSON, so the visitor is
 * told honestly what became of the request (the server's acceptance contract):
 *   accepted  form cleared, thank-you text (data-thank-you) shown, event
 *             `leadrouter:accepted` fired, {event: "generate_lead"} pushed to
 *             window.dataLayer once per lead;
 *   pending   data kept; the lead's status is polled until it is accepted;
 *   failed    (503, other 5xx, 429, network or CORS error) data kept; a retry
 *             button resends it under the same submission_id;
 *   invalid   (422) each error shown next to its field.
 * Each submit carries a client-made `submission_id` (the server's dedupe key),
 * kept in a hidden input for the life of the form's data: a retry of the same
 * data reuses it, changed data (say, corrected after a 422) gets a new one,
 * and an accepted answer clears the form for the next. The form's [data-leadrouter-status] element holds the
 * message; its data-state is sending|accepted|pending|failed|invalid.
 * Without JavaScript the form stays a plain HTML form post.
 */
(function () {
  'use strict';
  if (window.leadrouterForm) return; // included twice
  window.leadrouterForm = { version: 1 };

  const THANK_YOU = 'Thank you! We have received your request.';
  const MESSAGES = {
    sending: 'Sending your request…',
    pending: 'Your request is safe with us. We are confirming it now…',
    failed: 'We could not send your request. Your details are still here — please try again.',
    invalid: 'Please check the highlighted details and send again.',
  };
  const PUSHED_KEY = 'leadrouter:pushed';
  const POLL_FIRST_MS = 2000;
  const POLL_MAX_MS = 10000;
  const POLL_STEADY_FOR_MS = 30000; // poll every 2 s this long, then back off
  const POLL_GIVE_UP_MS = 10 * 60 * 1000;

  // Server ids already pushed to dataLayer (this page and this tab's session).
  const pushed = new Set(readPushed());

  function readPushed() {
    try {
      const list = JSON.parse(sessionStorage.getItem(PUSHED_KEY) || '[]');
      return Array.isArray(list) ? list : [];
    } catch (e) {
      return [];
    }
  }

  function pushLead(serverId) {
    if (!Array.isArray(window.dataLayer) || pushed.has(serverId)) return;
    pushed.add(serverId);
    try {
      sessionStorage.setItem(PUSHED_KEY, JSON.stringify(Array.from(pushed)));
    } catch (e) { /* storage unavailable: the in-page Set still guards */ }
    window.dataLayer.push({ event: 'generate_lead', submission_id: serverId });
  }

  function newId() {
    if (window.crypto && typeof crypto.randomUUID === 'function') return crypto.randomUUID();
    const bytes = new Uint8Array(16);
    if (window.crypto && crypto.getRandomValues) crypto.getRandomValues(bytes);
    else for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(Math.random() * 256);
    return Array.from(bytes, (b) => (b < 16 ? '0' : '') + b.toString(16)).join('');
  }

  // The form's fields as one object; a repeated name's values joined by commas.
  function fieldsOf(form) {
    const fields = {};
    new FormData(form).forEach((value, name) => {
      if (typeof value !== 'string' || name === 'submission_id') return; // files are not sent
      fields[name] = name in fields ? fields[name] + ',' + value : value;
    });
    return fields;
  }

  function enhance(form, action) {
    const idInput = document.createElement('input');
    idInput.type = 'hidden';
    idInput.name = 'submission_id';
    idInput.value = newId();
    form.appendChild(idInput);

    let status = form.querySelector('[data-leadrouter-status]');
    if (!status) {
      status = document.createElement('div');
      status.setAttribute('data-leadrouter-status', '');
      status.setAttribute('role', 'status');
      status.setAttribute('aria-live', 'polite');
      form.appendChild(status);
    }

    let busy = false;
    let sentFields = null; // the data sent under the current id
    let pollTimer = null;
    let pollRun = 0; // bumped to cancel the running poller

    function show(state, text, withRetry) {
      status.setAttribute('data-state', state);
      status.textContent = text;
      if (!withRetry) return;
      const retry = document.createElement('button');
      retry.type = 'button';
      retry.setAttribute('data-leadrouter-retry', '');
      retry.textContent = 'Try again';
      retry.addEventListener('click', send);
      status.appendChild(document.createTextNode(' '));
      status.appendChild(retry);
    }

    function clearErrors() {
      form.querySelectorAll('.leadrouter-error').forEach((span) => {
        const field = span.getAttribute('data-leadrouter-error-for');
        Array.from(form.elements).forEach((el) => {
          if (el.name === field) el.removeAttribute('aria-invalid');
        });
        span.remove();
      });
    }

    function showErrors(errors) {
      const unplaced = [];
      errors.forEach((error) => {
        const inputs = Array.from(form.elements).filter((el) => el.name && el.name === error.field);
        if (error.field === 'body' || inputs.length === 0) {
          unplaced.push(error.message);
          return;
        }
        const span = document.createElement('span');
        span.className = 'leadrouter-error';
        span.setAttribute('data-leadrouter-error-for', error.field);
        span.setAttribute('role', 'alert');
        span.textContent = error.message;
        inputs.forEach((el) => el.setAttribute('aria-invalid', 'true'));
        inputs[inputs.length - 1].after(span);
      });
      show('invalid', [MESSAGES.invalid].concat(unplaced).join(' '));
    }

    function stopPolling() {
      pollRun++;
      clearTimeout(pollTimer);
    }

    function accept(serverId, contract) {
      stopPolling();
      HTMLFormElement.prototype.reset.call(form); // even if a field is named "reset"
      idInput.value = newId(); // the next data is a new submission
      sentFields = null;
      clearErrors();
      show('accepted', form.getAttribute('data-thank-you') || THANK_YOU);
      form.dispatchEvent(new CustomEvent('leadrouter:accepted', {
        bubbles: true,
        detail: { submission_id: serverId, contract: contract },
      }));
      pushLead(serverId);
    }

    function poll(serverId) {
      stopPolling();
      const run = pollRun;
      const started = Date.now();
      const url = action.origin + '/v1/leads/' + encodeURIComponent(serverId) + '/status';
      let delay = POLL_FIRST_MS;
      const tick = async () => {
        let contract = null;
        try {
          const response = await fetch(url, { headers: { Accept: 'application/json' }, mode: 'cors' });
          if (response.ok) contract = await response.json();
        } catch (e) { /* offline or refused: ask again later */ }
        if (run !== pollRun) return;
        if (contract && contract.acceptance === 'accepted') return accept(serverId, contract);
        const elapsed = Date.now() - started;
        if (elapsed >= POLL_GIVE_UP_MS) return; // the pending message stays
        if (elapsed >= POLL_STEADY_FOR_MS) delay = Math.min(POLL_MAX_MS, delay * 1.5);
        pollTimer = setTimeout(tick, delay);
      };
      pollTimer = setTimeout(tick, delay);
    }

    function answer(response, contract, sent) {
      const code = response ? response.status : 0;
      if (!contract || typeof contract !== 'object') return show('failed', MESSAGES.failed, true);
      const serverId = contract.submission_id || idInput.value;
      if (code === 422 || contract.lead_state === 'invalid') {
        return showErrors(Array.isArray(contract.errors) ? contract.errors : []);
      }
      if (code < 300 && contract.acceptance === 'accepted') return accept(serverId, contract);
      if (code < 300 && contract.acceptance === 'pending') {
        show('pending', MESSAGES.pending);
        return poll(serverId);
      }
      show('failed', MESSAGES.failed, true); // 503 and other 5xx, 429, any other answer
    }

    async function send() {
      if (busy) return;
      busy = true;
      stopPolling();
      clearErrors();
      const fields = fieldsOf(form);
      const sent = JSON.stringify(fields);
      // The server keeps what it got under this id and would replay that
      // answer: changed data is a new submission, with a fresh id; the same
      // data (a retry) keeps it.
      if (sentFields !== null && sentFields !== sent) idInput.value = newId();
      sentFields = sent;
      const buttons = Array.from(form.querySelectorAll(
        'button:not([type]), button[type="submit"], input[type="submit"], input[type="image"]'
      )).filter((button) => !button.disabled);
      buttons.forEach((button) => { button.disabled = true; });
      show('sending', MESSAGES.sending);
      let response = null;
      let contract = null;
      try {
        response = await fetch(action.href, {
          method: 'POST',
          headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
          body: JSON.stringify(Object.assign(fields, { submission_id: idInput.value })),
          mode: 'cors',
        });
        contract = await response.json().catch(() => null);
      } catch (e) { /* network error or CORS refusal: failed below */ }
      buttons.forEach((button) => { button.disabled = false; });
      busy = false;
      answer(response, contract, sent);
    }

    form.addEventListener('submit', (event) => {
      event.preventDefault();
      send();
    });
  }

  function start() {
    document.querySelectorAll('form[data-leadrouter]').forEach((form) => {
      let action;
      try {
        action = new URL(form.getAttribute('action') || '', document.baseURI);
      } catch (e) {
        return;
      }
      if (action.pathname === '/v1/leads') enhance(form, action);
    });
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
