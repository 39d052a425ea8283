'use strict';
// Self-check for src/core/node_proxy_preload.js, usable on the host and as a template for
// in-sandbox tests:
//
//   HTTPS_PROXY=http://127.0.0.1:3128 HTTP_PROXY=http://127.0.0.1:3128 \
//   NO_PROXY=localhost,127.0.0.1,::1 \
//   node --require ./src/core/node_proxy_preload.js tests/helpers/node_preload_check.js \
//        <approved_https_url> <approved_http_url> <denied_url> [ca.pem]
//
// Exercises https.get, http.get, fetch (https and http, GET and POST) and a denied host through
// https.get/http.get and fetch, then prints one JSON line:
//   {"ok":bool,"preload":{...},"checks":{"<name>":{"ok":bool,...}},"failed":[names]}
// and exits 0 when every check passed, 1 otherwise (2 on bad usage).
//
// TLS trust: https.get gets `ca` from the file; fetch cannot take a CA, so when ca.pem is given
// and NODE_EXTRA_CA_CERTS does not already name it, the script re-runs itself once with
// NODE_EXTRA_CA_CERTS=<ca.pem> (same node binary, same --require/NODE_OPTIONS, same stdio).
//
// Expectations: approved URLs answer 200 (the POST check is only run against the https URL and
// accepts any 2xx/4xx/5xx answer that is not a transport error, since origins differ in what
// they do with a POST); the denied URL fails: for https: the request errors and its message
// contains "egress denied" (fetch: TypeError 'fetch failed' whose cause carries it); for http:
// the proxy's 403 comes back as the response and its JSON `reason` is reported.

const fs = require('fs');
const http = require('http');
const https = require('https');
const path = require('path');

const MARK = Symbol.for('agent-sandbox.node-proxy-preload');
const TIMEOUT_MS = Number(process.env.NODE_PRELOAD_CHECK_TIMEOUT_MS || 15000);

function usage() {
  process.stdout.write(JSON.stringify({ ok: false, error: 'usage: node --require <preload> ' +
    path.basename(__filename) + ' <approved_https_url> <approved_http_url> <denied_url> [ca.pem]' }) + '\n');
  process.exit(2);
}

const [httpsUrl, httpUrl, deniedUrl, caFile] = process.argv.slice(2);
if (!httpsUrl || !httpUrl || !deniedUrl) usage();

if (caFile && process.env.NODE_EXTRA_CA_CERTS !== path.resolve(caFile) && !process.env.NODE_PRELOAD_CHECK_CHILD) {
  // Re-run with the CA trusted process-wide so fetch (which takes no `ca`) can verify it too.
  const { spawnSync } = require('child_process');
  const r = spawnSync(process.execPath, process.execArgv.concat([__filename], process.argv.slice(2)), {
    env: Object.assign({}, process.env, { NODE_EXTRA_CA_CERTS: path.resolve(caFile), NODE_PRELOAD_CHECK_CHILD: '1' }),
    stdio: 'inherit',
  });
  process.exit(r.status === null ? 1 : r.status);
}

const ca = caFile ? fs.readFileSync(caFile) : undefined;

function withTimeout(promise, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(what + ' timed out after ' + TIMEOUT_MS + ' ms')), TIMEOUT_MS);
    }),
  ]).finally(() => clearTimeout(timer));
}

function parseJson(text) {
  try { return JSON.parse(text); } catch (_) { return null; }
}

function errInfo(err) {
  if (!err) return null;
  const out = { name: err.name, message: String(err.message) };
  if (err.code) out.code = err.code;
  if (err.cause) out.cause = errInfo(err.cause);
  return out;
}

// Node core client (http.get / https.get): resolves {status, body, json} or rejects with the error.
function coreGet(mod, url, options) {
  return withTimeout(new Promise((resolve, reject) => {
    const req = mod.get(url, options || {}, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        resolve({ status: res.statusCode, body, json: parseJson(body) });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
  }), 'GET ' + url);
}

async function fetchText(url, init) {
  const res = await withTimeout(fetch(url, init), 'fetch ' + url);
  const body = await withTimeout(res.text(), 'fetch body ' + url);
  return { status: res.status, url: res.url, body, json: parseJson(body) };
}

function summarize(r) {
  return { status: r.status, body: r.json !== null ? r.json : r.body.slice(0, 200) };
}

async function expectOk(name, fn, checks) {
  try {
    const r = await fn();
    checks[name] = Object.assign({ ok: r.status === 200 }, summarize(r));
  } catch (err) {
    checks[name] = { ok: false, error: errInfo(err) };
  }
}

function deniedMessage(err) {
  // The preload's CONNECT error, or fetch's TypeError whose cause is that error.
  for (let e = err; e; e = e.cause) {
    if (/egress denied/i.test(String(e.message))) return String(e.message);
  }
  return null;
}

async function expectDenied(name, fn, checks) {
  const isHttp = new URL(deniedUrl).protocol === 'http:';
  try {
    const r = await fn();
    // Plain HTTP: the proxy's refusal is an ordinary 403 response with the JSON reason.
    const reason = r.json && r.json.error === 'egress_denied' ? r.json.reason : null;
    checks[name] = Object.assign({ ok: isHttp && r.status === 403 && !!reason, reason }, summarize(r));
  } catch (err) {
    const message = deniedMessage(err);
    checks[name] = { ok: !isHttp && !!message, message, error: errInfo(err) };
  }
}

async function main() {
  const state = globalThis[MARK] || null;
  const checks = {};
  const tlsOptions = ca ? { ca } : {};
  const modFor = (u) => (new URL(u).protocol === 'https:' ? https : http);

  await expectOk('https_get', () => coreGet(https, httpsUrl, tlsOptions), checks);
  await expectOk('http_get', () => coreGet(http, httpUrl), checks);
  await expectOk('fetch_https', () => fetchText(httpsUrl), checks);
  await expectOk('fetch_http', () => fetchText(httpUrl), checks);
  try {
    const r = await fetchText(httpsUrl, { method: 'POST', body: 'hello from node', headers: { 'content-type': 'text/plain' } });
    checks.fetch_https_post = Object.assign({ ok: r.status > 0 }, summarize(r));
  } catch (err) {
    checks.fetch_https_post = { ok: false, error: errInfo(err) };
  }
  await expectDenied('denied_core', () => coreGet(modFor(deniedUrl), deniedUrl, tlsOptions), checks);
  await expectDenied('denied_fetch', () => fetchText(deniedUrl), checks);

  const failed = Object.keys(checks).filter((k) => !checks[k].ok);
  const preload = state ? { installed: !!state.installed, http: state.http, https: state.https, noProxy: state.noProxy }
                        : null;
  const ok = !!(state && state.installed) && failed.length === 0;
  if (!state || !state.installed) failed.unshift('preload');
  process.stdout.write(JSON.stringify({ ok, preload, checks, failed }) + '\n');
  process.exitCode = ok ? 0 : 1;
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ ok: false, error: errInfo(err) }) + '\n');
  process.exitCode = 1;
});
