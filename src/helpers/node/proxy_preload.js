'use strict';
// agent-sandbox: make Node's standard HTTP clients honour HTTP(S)_PROXY / NO_PROXY.
//
// Loaded with `node --require <this file>` (through NODE_OPTIONS) inside sandboxes whose only
// way out is an HTTP proxy (HTTP `CONNECT host:443` for HTTPS, absolute-form requests for plain
// HTTP). Node's `http`, `https` and global `fetch` ignore the proxy variables; this file:
//   - https: replaces `https.globalAgent` with an https.Agent subclass whose createConnection
//     opens a CONNECT tunnel through the proxy and starts TLS inside it (SNI = target host);
//   - http:  wraps `http.request` / `http.get` so requests go to the proxy in absolute form;
//   - fetch: wraps `globalThis.fetch` so proxied URLs are fetched through the two above.
// Hosts matching NO_PROXY (exact name, name suffix, `.suffix`, `*`; optional `:port`) and
// loopback literals / localhost always connect directly. Requests that bring their own agent
// (other than the default agents, or `agent: false`) or their own createConnection/socketPath
// are left untouched. A CONNECT refusal fails the request with an Error whose message starts
// "egress denied: <reason>" when the proxy answers with its JSON denial body.
// Only Node core modules are used (Node >= 18, CommonJS). The file never throws while loading,
// never prints, and installs itself once per JavaScript realm even if required twice.
// Introspection: globalThis[Symbol.for('agent-sandbox.node-proxy-preload')].

(function installAgentSandboxProxyPreload() {
  const MARK = Symbol.for('agent-sandbox.node-proxy-preload');
  try {
    if (globalThis[MARK]) return;
    const state = { version: 1, installed: false, http: null, https: null, noProxy: '' };
    Object.defineProperty(globalThis, MARK, { value: state, enumerable: false, configurable: false, writable: false });
    install(state);
  } catch (_) {
    // Never let the preload break the program.
  }

  function install(state) {
    const env = process.env;
    const pick = (name) => {
      const lower = env[name.toLowerCase()];
      if (typeof lower === 'string' && lower.trim() !== '') return lower;
      const upper = env[name.toUpperCase()];
      if (typeof upper === 'string' && upper.trim() !== '') return upper;
      return '';
    };
    const httpProxy = parseProxy(pick('http_proxy'));
    const httpsProxy = parseProxy(pick('https_proxy'));
    if (!httpProxy && !httpsProxy) return;

    const net = require('net');
    const tls = require('tls');
    const http = require('http');
    const https = require('https');
    const url = require('url');
    const stream = require('stream');

    const noProxyText = pick('no_proxy');
    const noProxyRules = parseNoProxy(noProxyText);
    state.http = httpProxy && { host: httpProxy.host, port: httpProxy.port };
    state.https = httpsProxy && { host: httpsProxy.host, port: httpsProxy.port };
    state.noProxy = noProxyText;

    const HEAD_LIMIT = 16 * 1024;

    // ---------------------------------------------------------------- helpers

    function parseProxy(text) {
      if (!text) return null;
      let s = String(text).trim();
      if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(s)) s = 'http://' + s;
      let u;
      try { u = new URL(s); } catch (_) { return null; }
      if (u.protocol !== 'http:') return null;
      const host = stripBrackets(u.hostname);
      if (!host) return null;
      const port = u.port ? Number(u.port) : 80;
      let auth = null;
      if (u.username || u.password) {
        let user = u.username;
        let pass = u.password;
        try { user = decodeURIComponent(user); pass = decodeURIComponent(pass); } catch (_) { /* keep raw */ }
        auth = 'Basic ' + Buffer.from(user + ':' + pass).toString('base64');
      }
      return { host, port, auth };
    }

    function stripBrackets(h) {
      h = String(h == null ? '' : h);
      return h.length > 1 && h[0] === '[' && h[h.length - 1] === ']' ? h.slice(1, -1) : h;
    }

    function canonicalHost(h) {
      h = stripBrackets(h).toLowerCase();
      if (h.endsWith('.')) h = h.slice(0, -1);
      if (net.isIPv6(h)) {
        try { h = stripBrackets(new URL('http://[' + h + ']/').hostname); } catch (_) { /* keep */ }
      }
      return h;
    }

    function parseNoProxy(text) {
      const rules = [];
      for (let e of String(text || '').split(/[\s,]+/)) {
        e = e.trim().toLowerCase();
        if (!e) continue;
        if (e === '*') { rules.push({ all: true }); continue; }
        let host = e;
        let port = 0;
        let m = /^\[([^\]]+)\](?::(\d+))?$/.exec(e);
        if (m) {
          host = m[1];
          port = m[2] ? Number(m[2]) : 0;
        } else if ((m = /^([^:]+):(\d+)$/.exec(e))) {
          host = m[1];
          port = Number(m[2]);
        }
        if (host.startsWith('*.')) host = host.slice(2);
        else if (host.startsWith('.')) host = host.slice(1);
        host = canonicalHost(host);
        if (host) rules.push({ all: false, host, port });
      }
      return rules;
    }

    function isLoopback(h) {
      if (h === 'localhost' || h.endsWith('.localhost')) return true;
      if (net.isIPv4(h)) return h.split('.')[0] === '127';
      if (net.isIPv6(h)) return h === '::1' || /^::ffff:7f[0-9a-f]{2}:/.test(h);
      return false;
    }

    // True when a connection to host:port must not use the proxy.
    function bypass(hostname, port) {
      const h = canonicalHost(hostname);
      if (!h || isLoopback(h)) return true;
      for (const r of noProxyRules) {
        if (r.all) return true;
        if (r.port && r.port !== Number(port)) continue;
        if (h === r.host || h.endsWith('.' + r.host)) return true;
      }
      return false;
    }

    function hostForUrl(h) {
      return net.isIPv6(h) ? '[' + h + ']' : h;
    }

    function proxyForUrl(u) {
      const host = stripBrackets(u.hostname);
      if (u.protocol === 'https:') {
        if (!httpsProxy || bypass(host, u.port || 443)) return null;
        return httpsProxy;
      }
      if (u.protocol === 'http:') {
        if (!httpProxy || bypass(host, u.port || 80)) return null;
        return httpProxy;
      }
      return null;
    }
    state.proxyFor = (target) => {
      try {
        const p = proxyForUrl(target instanceof URL ? target : new URL(String(target)));
        return p ? 'http://' + hostForUrl(p.host) + ':' + p.port : null;
      } catch (_) { return null; }
    };

    // ------------------------------------------------- https: CONNECT tunnels

    function connectError(target, statusLine, statusCode, bodyText) {
      let info = null;
      const a = bodyText.indexOf('{');
      const b = bodyText.lastIndexOf('}');
      if (a >= 0 && b > a) {
        try { info = JSON.parse(bodyText.slice(a, b + 1)); } catch (_) { info = null; }
      }
      if (info === null || typeof info !== 'object') info = null;
      const reason = info && typeof info.reason === 'string' ? info.reason : '';
      const advice = info && typeof info.advice === 'string' ? info.advice : '';
      const denied = !!info && info.error === 'egress_denied';
      let msg;
      if (denied) msg = 'egress denied: ' + (reason || 'refused by the egress proxy');
      else if (reason) msg = 'proxy refused CONNECT ' + target + ': ' + reason;
      else msg = 'proxy refused CONNECT ' + target;
      msg += ' (proxy answered "' + statusLine + '" to CONNECT ' + target + ')';
      if (advice) msg += '; advice: ' + advice;
      const err = new Error(msg);
      err.code = denied ? 'EGRESS_DENIED' : 'ERR_PROXY_CONNECT';
      err.statusCode = statusCode;
      err.statusLine = statusLine;
      err.target = target;
      if (info) {
        err.reason = reason;
        err.advice = advice;
        if (typeof info.host === 'string') err.host = info.host;
        err.proxyResponse = info;
      }
      return err;
    }

    // Opens a CONNECT tunnel to host:port through the HTTPS proxy and starts TLS in it.
    function tunnel(options, host, port, callback) {
      const target = hostForUrl(host) + ':' + port;
      const sock = net.connect({ host: httpsProxy.host, port: httpsProxy.port });
      let done = false;
      let buf = Buffer.alloc(0);
      let headEnd = -1;
      let statusLine = '';
      let statusCode = 0;
      let contentLength = -1;

      const cleanup = () => {
        sock.removeListener('connect', onConnect);
        sock.removeListener('data', onData);
        sock.removeListener('end', onEnd);
        sock.removeListener('close', onEnd);
        sock.removeListener('error', onError);
        sock.removeListener('timeout', onTimeout);
        if (options.timeout) sock.setTimeout(0);
      };
      const finish = (err, result) => {
        if (done) return;
        done = true;
        cleanup();
        if (err) {
          sock.on('error', () => {});
          sock.destroy();
        }
        callback(err, result);
      };
      const refuse = () => {
        const end = contentLength >= 0 ? Math.min(buf.length, headEnd + contentLength) : buf.length;
        finish(connectError(target, statusLine, statusCode, buf.subarray(headEnd, end).toString('utf8')));
      };

      function onConnect() {
        let req = 'CONNECT ' + target + ' HTTP/1.1\r\nHost: ' + target + '\r\n';
        if (httpsProxy.auth) req += 'Proxy-Authorization: ' + httpsProxy.auth + '\r\n';
        sock.write(req + '\r\n');
      }
      function onData(chunk) {
        buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
        if (headEnd < 0) {
          const i = buf.indexOf('\r\n\r\n');
          if (i < 0 || i + 4 > HEAD_LIMIT) {
            if (buf.length > HEAD_LIMIT || i >= 0) {
              finish(Object.assign(new Error('proxy response to CONNECT ' + target + ' exceeds 16 KiB'),
                                   { code: 'ERR_PROXY_CONNECT' }));
            }
            return;
          }
          headEnd = i + 4;
          const lines = buf.subarray(0, i).toString('latin1').split('\r\n');
          statusLine = lines[0];
          const m = /^HTTP\/\d(?:\.\d)?[ \t]+(\d{3})(?:[ \t].*)?$/.exec(statusLine);
          if (!m) {
            finish(Object.assign(new Error('malformed proxy response to CONNECT ' + target + ': ' +
                                           JSON.stringify(statusLine.slice(0, 200))),
                                 { code: 'ERR_PROXY_CONNECT' }));
            return;
          }
          statusCode = Number(m[1]);
          if (statusCode >= 200 && statusCode < 300) {
            upgrade(buf.subarray(headEnd));
            return;
          }
          for (const line of lines.slice(1)) {
            const c = line.indexOf(':');
            if (c > 0 && line.slice(0, c).trim().toLowerCase() === 'content-length') {
              const n = parseInt(line.slice(c + 1).trim(), 10);
              if (n >= 0) contentLength = n;
            }
          }
        }
        if ((contentLength >= 0 && buf.length - headEnd >= contentLength) || buf.length - headEnd >= HEAD_LIMIT) {
          refuse();
        }
      }
      function onEnd() {
        if (headEnd >= 0) refuse();
        else finish(Object.assign(new Error('proxy closed the connection before answering CONNECT ' + target),
                                  { code: 'ECONNRESET' }));
      }
      function onError(err) {
        const e = new Error('cannot reach the proxy ' + hostForUrl(httpsProxy.host) + ':' + httpsProxy.port +
                            ' for CONNECT ' + target + ': ' + (err && err.message), { cause: err });
        if (err && err.code) e.code = err.code;
        finish(e);
      }
      function onTimeout() {
        finish(Object.assign(new Error('timed out waiting for the proxy to answer CONNECT ' + target),
                             { code: 'ETIMEDOUT' }));
      }
      function upgrade(rest) {
        sock.removeListener('data', onData);
        sock.pause();
        if (rest.length) sock.unshift(rest);
        let servername = options.servername;
        if (!servername) servername = net.isIP(host) ? undefined : host;
        const tlsOptions = Object.assign({}, options, { socket: sock, host, port });
        delete tlsOptions.servername;
        if (servername) tlsOptions.servername = servername;
        let tlsSocket;
        try {
          tlsSocket = tls.connect(tlsOptions);
        } catch (e) {
          finish(e);
          return;
        }
        finish(null, tlsSocket);
      }

      sock.on('connect', onConnect);
      sock.on('data', onData);
      sock.on('end', onEnd);
      sock.on('close', onEnd);
      sock.on('error', onError);
      if (options.timeout) {
        sock.setTimeout(options.timeout);
        sock.on('timeout', onTimeout);
      }
    }

    class ProxyHttpsAgent extends https.Agent {
      createConnection(options, callback) {
        const opts = options || {};
        const host = stripBrackets(opts.host || opts.hostname || 'localhost');
        const port = Number(opts.port) || 443;
        if (typeof callback !== 'function' || opts.socketPath || !httpsProxy || bypass(host, port)) {
          return super.createConnection(options, callback);
        }
        tunnel(opts, host, port, callback);
        return undefined;
      }
    }
    state.ProxyHttpsAgent = ProxyHttpsAgent;

    let proxyHttpsAgent = null;
    if (httpsProxy) {
      proxyHttpsAgent = new ProxyHttpsAgent({ keepAlive: false });
      state.httpsAgent = proxyHttpsAgent;
      https.globalAgent = proxyHttpsAgent;
    }

    // ---------------------------------------------------- http: absolute form

    const originalHttpRequest = http.request;
    const originalHttpGet = http.get;
    const proxyHttpAgent = new http.Agent({ keepAlive: false });

    function withHostHeader(headers, value) {
      if (Array.isArray(headers)) {
        if (headers.length && Array.isArray(headers[0])) {
          if (headers.some((p) => String(p[0]).toLowerCase() === 'host')) return headers;
          return headers.concat([['Host', value]]);
        }
        for (let i = 0; i < headers.length; i += 2) {
          if (String(headers[i]).toLowerCase() === 'host') return headers;
        }
        return headers.concat(['Host', value]);
      }
      const out = Object.assign({}, headers || {});
      for (const k of Object.keys(out)) {
        if (k.toLowerCase() === 'host') return out;
      }
      out.Host = value;
      return out;
    }

    // Returns [options, cb] rewritten for the proxy, or null when the request goes direct.
    function rewriteForProxy(input, options, cb) {
      if (!httpProxy) return null;
      if (typeof input === 'string') input = url.urlToHttpOptions(new URL(input));
      else if (input instanceof URL) input = url.urlToHttpOptions(input);
      else { cb = options; options = input; input = null; }
      if (typeof options === 'function') { cb = options; options = input || {}; }
      else options = Object.assign(input || {}, options);
      if (!options || typeof options !== 'object') return null;

      if (options.socketPath || typeof options.createConnection === 'function') return null;
      const agent = options.agent;
      if (agent !== undefined && agent !== null && agent !== false && agent !== http.globalAgent) return null;
      if (options.protocol != null && options.protocol !== 'http:') return null;
      const rawHost = options.hostname || options.host || 'localhost';
      if (typeof rawHost !== 'string') return null;
      const host = stripBrackets(rawHost);
      const port = Number(options.port || options.defaultPort || 80);
      if (!(port > 0 && port < 65536) || bypass(host, port)) return null;

      let path = options.path == null ? '/' : String(options.path);
      if (!path.startsWith('/')) path = '/' + path;
      const authority = hostForUrl(host) + (port === 80 ? '' : ':' + port);
      // String keys only: Node 18.20's urlToHttpOptions copies the URL's internal context symbol,
      // which makes ClientRequest treat the object as a URL and re-derive host/path from it.
      const out = {};
      for (const k of Object.keys(options)) out[k] = options[k];
      delete out.hostname;
      delete out.family;
      delete out.lookup;
      delete out.hints;
      delete out.servername;
      out.host = httpProxy.host;
      out.port = httpProxy.port;
      out.path = 'http://' + authority + path;
      let headers = withHostHeader(options.headers, authority);
      if (httpProxy.auth) {
        if (Array.isArray(headers)) {
          headers = headers.length && Array.isArray(headers[0])
            ? headers.concat([['Proxy-Authorization', httpProxy.auth]])
            : headers.concat(['Proxy-Authorization', httpProxy.auth]);
        } else if (!Object.keys(headers).some((k) => k.toLowerCase() === 'proxy-authorization')) {
          headers['Proxy-Authorization'] = httpProxy.auth;
        }
      }
      out.headers = headers;
      out.agent = agent === false ? false : proxyHttpAgent;
      return [out, cb];
    }

    function request(input, options, cb) {
      let rewritten = null;
      try { rewritten = rewriteForProxy(input, options, cb); } catch (_) { rewritten = null; }
      if (rewritten) {
        return rewritten[1] === undefined
          ? originalHttpRequest.call(http, rewritten[0])
          : originalHttpRequest.call(http, rewritten[0], rewritten[1]);
      }
      return originalHttpRequest.apply(http, arguments);
    }
    function get(input, options, cb) {
      const req = request.apply(this, arguments);
      req.end();
      return req;
    }
    Object.defineProperty(request, 'name', { value: 'request' });
    Object.defineProperty(get, 'name', { value: 'get' });
    if (httpProxy) {
      http.request = request;
      http.get = get;
      state.original = { request: originalHttpRequest, get: originalHttpGet };
    }

    try { require('module').syncBuiltinESMExports(); } catch (_) { /* older Node */ }

    // --------------------------------------------------------------- fetch

    const originalFetch = globalThis.fetch;
    if (typeof originalFetch === 'function' && typeof globalThis.Response === 'function' &&
        typeof globalThis.Request === 'function' && typeof globalThis.Headers === 'function') {
      installFetch(originalFetch);
    }

    function installFetch(origFetch) {
      const RS = globalThis.ReadableStream || require('stream/web').ReadableStream;
      const NULL_BODY = new Set([101, 103, 204, 205, 304]);
      const REDIRECT = new Set([301, 302, 303, 307, 308]);
      const BODY_HEADERS = ['content-encoding', 'content-language', 'content-location', 'content-type', 'content-length'];

      const fetchFailed = (cause) => new TypeError('fetch failed', { cause });
      const abortReason = (signal) => {
        if (signal && signal.reason !== undefined) return signal.reason;
        return new DOMException('This operation was aborted', 'AbortError');
      };

      function peekUrl(input) {
        if (typeof input === 'string') return new URL(input);
        if (input instanceof URL) return input;
        if (input && typeof input === 'object' && typeof input.url === 'string' &&
            input instanceof globalThis.Request) return new URL(input.url);
        return new URL(String(input));
      }

      function fetch(input, init = undefined) {
        let proxied = false;
        try {
          proxied = !(init && typeof init === 'object' && init.dispatcher) && proxyForUrl(peekUrl(input)) !== null;
        } catch (_) {
          proxied = false;
        }
        if (!proxied) return origFetch.call(globalThis, input, init);
        return proxiedFetch(input, init);
      }

      async function proxiedFetch(input, init) {
        const request = new globalThis.Request(input, init);
        const signal = request.signal;
        if (signal && signal.aborted) throw abortReason(signal);
        let body = null;
        if (request.body !== null) body = Buffer.from(await request.arrayBuffer());
        const headers = {};
        for (const [k, v] of request.headers) headers[k] = v;
        if (!('accept' in headers)) headers.accept = '*/*';
        if (!('accept-language' in headers)) headers['accept-language'] = '*';
        if (!('sec-fetch-mode' in headers)) headers['sec-fetch-mode'] = 'cors';
        if (!('user-agent' in headers)) headers['user-agent'] = 'node';
        const st = {
          url: new URL(request.url),
          method: request.method,
          headers,
          body,
          redirect: request.redirect || 'follow',
          signal,
          count: 0,
        };
        for (;;) {
          const res = await sendOnce(st);
          const status = res.statusCode;
          if (REDIRECT.has(status) && res.headers.location !== undefined && st.redirect !== 'manual') {
            res.on('error', () => {});
            res.destroy();
            if (st.redirect === 'error') throw fetchFailed(new Error('unexpected redirect'));
            let next;
            try { next = new URL(res.headers.location, st.url); } catch (e) { throw fetchFailed(e); }
            if (next.protocol !== 'http:' && next.protocol !== 'https:') {
              throw fetchFailed(new TypeError('URL scheme must be a HTTP(S) scheme'));
            }
            if (++st.count > 20) throw fetchFailed(new Error('redirect count exceeded'));
            if (((status === 301 || status === 302) && st.method === 'POST') ||
                (status === 303 && st.method !== 'GET' && st.method !== 'HEAD')) {
              st.method = 'GET';
              st.body = null;
              for (const h of BODY_HEADERS) delete st.headers[h];
            }
            if (next.origin !== st.url.origin) {
              for (const h of ['authorization', 'proxy-authorization', 'cookie', 'host']) delete st.headers[h];
            }
            st.url = next;
            continue;
          }
          return makeResponse(res, st);
        }
      }

      function sendOnce(st) {
        return new Promise((resolve, reject) => {
          const u = st.url;
          const isHttps = u.protocol === 'https:';
          const headers = Object.assign({}, st.headers);
          if (st.body) headers['content-length'] = String(st.body.length);
          else if (st.method === 'POST' || st.method === 'PUT') headers['content-length'] = '0';
          const opts = {
            method: st.method,
            protocol: u.protocol,
            hostname: stripBrackets(u.hostname),
            port: u.port || (isHttps ? 443 : 80),
            path: (u.pathname || '/') + u.search,
            headers,
          };
          let req;
          let settled = false;
          const onAbort = () => {
            if (settled) return;
            settled = true;
            const reason = abortReason(st.signal);
            if (req) req.destroy();
            reject(reason);
          };
          const done = () => {
            settled = true;
            if (st.signal) st.signal.removeEventListener('abort', onAbort);
          };
          try {
            if (isHttps) {
              opts.agent = proxyHttpsAgent || undefined;
              req = https.request(opts);
            } else {
              req = request(opts);
            }
          } catch (e) {
            settled = true;
            reject(fetchFailed(e));
            return;
          }
          if (st.signal) st.signal.addEventListener('abort', onAbort, { once: true });
          req.on('error', (err) => {
            if (settled) return;
            done();
            reject(fetchFailed(err));
          });
          req.on('response', (res) => {
            if (settled) { res.destroy(); return; }
            done();
            resolve(res);
          });
          req.end(st.body || undefined);
        });
      }

      function decoded(res) {
        const codings = String(res.headers['content-encoding'] || '')
          .toLowerCase().split(',').map((s) => s.trim()).filter(Boolean);
        if (!codings.length) return res;
        const zlib = require('zlib');
        const zopts = { flush: zlib.constants.Z_SYNC_FLUSH, finishFlush: zlib.constants.Z_SYNC_FLUSH };
        const bopts = {
          flush: zlib.constants.BROTLI_OPERATION_FLUSH,
          finishFlush: zlib.constants.BROTLI_OPERATION_FLUSH,
        };
        const decoders = [];
        for (const c of codings.reverse()) {
          if (c === 'gzip' || c === 'x-gzip') decoders.push(zlib.createGunzip(zopts));
          else if (c === 'deflate') decoders.push(zlib.createInflate(zopts));
          else if (c === 'br') decoders.push(zlib.createBrotliDecompress(bopts));
          else if (c !== 'identity') return res;
        }
        if (!decoders.length) return res;
        return stream.pipeline(res, ...decoders, () => {});
      }

      function makeResponse(res, st) {
        const status = res.statusCode;
        const headers = new globalThis.Headers();
        const raw = res.rawHeaders || [];
        for (let i = 0; i + 1 < raw.length; i += 2) {
          try { headers.append(raw[i], raw[i + 1]); } catch (_) { /* skip invalid header */ }
        }
        let body = null;
        if (st.method === 'HEAD' || NULL_BODY.has(status)) {
          res.resume();
        } else {
          body = webStream(decoded(res), res, st.signal);
        }
        let response;
        const init = { status, statusText: res.statusMessage || '', headers };
        try {
          response = new globalThis.Response(body, init);
        } catch (_) {
          try {
            init.statusText = '';
            response = new globalThis.Response(body, init);
          } catch (e) {
            res.destroy();
            throw fetchFailed(e);
          }
        }
        const finalUrl = new URL(st.url.href);
        finalUrl.hash = '';
        decorate(response, finalUrl.href, st.count > 0);
        return response;
      }

      function decorate(response, href, redirected) {
        const define = (name, value) => {
          try {
            Object.defineProperty(response, name, { value, enumerable: false, configurable: true, writable: false });
          } catch (_) { /* leave as is */ }
        };
        define('url', href);
        define('redirected', redirected);
        const clone = Object.getPrototypeOf(response).clone;
        if (typeof clone === 'function') {
          define('clone', function () {
            const c = clone.call(this);
            decorate(c, href, redirected);
            return c;
          });
        }
      }

      function webStream(src, res, signal) {
        let finished = false;
        let controllerRef = null;
        const onAbort = () => {
          if (finished) return;
          finished = true;
          const reason = abortReason(signal);
          try { controllerRef.error(reason); } catch (_) { /* already closed */ }
          src.destroy();
          if (src !== res) res.destroy();
        };
        const stop = () => {
          finished = true;
          if (signal) signal.removeEventListener('abort', onAbort);
        };
        return new RS({
          start(controller) {
            controllerRef = controller;
            if (signal) signal.addEventListener('abort', onAbort, { once: true });
            src.on('data', (chunk) => {
              if (finished) return;
              controller.enqueue(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength).slice());
              if (controller.desiredSize <= 0) src.pause();
            });
            src.on('end', () => {
              if (finished) return;
              stop();
              controller.close();
            });
            src.on('error', (err) => {
              if (finished) return;
              stop();
              controller.error(new TypeError('terminated', { cause: err }));
            });
            src.on('close', () => {
              if (finished) return;
              stop();
              controller.error(new TypeError('terminated', { cause: new Error('other side closed') }));
            });
          },
          pull() {
            src.resume();
          },
          cancel() {
            stop();
            src.destroy();
            if (src !== res) res.destroy();
          },
        }, { highWaterMark: 65536, size: (chunk) => chunk.byteLength });
      }

      Object.defineProperty(fetch, 'name', { value: 'fetch' });
      const desc = Object.getOwnPropertyDescriptor(globalThis, 'fetch');
      if (desc && !desc.configurable && !desc.writable) return;
      Object.defineProperty(globalThis, 'fetch', {
        value: fetch,
        writable: desc ? !!desc.writable || !!desc.set : true,
        enumerable: desc ? !!desc.enumerable : false,
        configurable: desc ? !!desc.configurable : true,
      });
      state.originalFetch = origFetch;
    }

    state.installed = true;
  }
})();
