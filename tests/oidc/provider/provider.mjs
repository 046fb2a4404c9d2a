// A real OpenID provider for lorahub's sign-in tests: node-oidc-provider (OpenID-certified),
// with a plain sign-in form of its own, the test's users and groups read from a JSON file at
// every sign-in (a test edits it to move a user between groups), and one fault switch for the
// tests of refused tokens.
//
// node provider.mjs --port 4411 --client lorahub:secret:http://127.0.0.1:8000 \
//                   --users users.json --faults faults.json [--trailing-slash]
//
// users.json: {"alice": {"password": "...", "email": "...", "groups": ["..."], "mfa": true}}
// faults.json: {"id_token": "tamper" | "audience" | "expired" | ""} (read at each token call)
import { readFileSync, existsSync } from 'node:fs';
import http from 'node:http';
import { parseArgs } from 'node:util';
import * as jose from 'jose';
import Provider from 'oidc-provider';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string' },
    client: { type: 'string', multiple: true },
    users: { type: 'string' },
    faults: { type: 'string' },
    // the issuer ends in "/", as Auth0's and authentik's do
    'trailing-slash': { type: 'boolean' },
  },
});
const port = Number(args.port);
const issuer = `http://127.0.0.1:${port}${args['trailing-slash'] ? '/' : ''}`;
const readJson = (path, fallback) => (path && existsSync(path) ? JSON.parse(readFileSync(path, 'utf8')) : fallback);
const users = () => readJson(args.users, {});

// a fresh signing key per start: a restarted provider has rotated its keys
const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
const jwk = { ...(await jose.exportJWK(privateKey)), kid: `k${Date.now()}`, alg: 'RS256', use: 'sig' };

const clients = (args.client || []).map((spec) => {
  const [client_id, client_secret, ...rest] = spec.split(':');
  const base = rest.join(':');
  return {
    client_id,
    client_secret,
    redirect_uris: [`${base}/oidc/callback/`],
    post_logout_redirect_uris: [`${base}/accounts/login/`],
    response_types: ['code'],
    grant_types: ['authorization_code'],
    token_endpoint_auth_method: 'client_secret_post',
  };
});

const provider = new Provider(issuer, {
  clients,
  jwks: { keys: [jwk] },
  cookies: { keys: ['lorahub-test-cookie-key'] },
  conformIdTokenClaims: false, // the ID token carries the groups, as many providers do
  claims: {
    // how the user authenticated, in every ID token (as Keycloak and Entra ID send it): the
    // console reads the second factor from amr
    openid: ['sub', 'amr', 'auth_time'],
    email: ['email', 'email_verified'],
    profile: ['preferred_username', 'given_name', 'family_name'],
    groups: ['groups'],
  },
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: {
      enabled: true,
      logoutSource: async (ctx, form) => {
        ctx.body = `<!doctype html><title>Sign out</title>${form}<button form="op.logoutForm" name="logout" value="yes" id="op-logout">Sign out of the provider</button>`;
      },
    },
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, id) {
    const user = users()[id];
    if (!user) return undefined;
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          email: user.email || `${id}@example.test`,
          email_verified: true,
          preferred_username: id,
          given_name: id,
          family_name: 'Test',
          groups: user.groups || [],
        };
      },
    };
  },
});

// the fault switch: the ID token of the token response, altered as a test asks
provider.use(async (ctx, next) => {
  await next();
  if (ctx.path !== '/token' || !ctx.body || !ctx.body.id_token) return;
  const fault = readJson(args.faults, {}).id_token || '';
  if (!fault) return;
  const [header, payload, signature] = ctx.body.id_token.split('.');
  const claims = JSON.parse(Buffer.from(payload, 'base64url').toString());
  if (fault === 'tamper') {
    // a privilege the provider never gave, signature left as it was
    claims.groups = [...(claims.groups || []), 'lorahub-operators'];
    ctx.body.id_token = [header, Buffer.from(JSON.stringify(claims)).toString('base64url'), signature].join('.');
    return;
  }
  if (fault === 'audience') claims.aud = 'another-client';
  if (fault === 'expired') {
    claims.iat -= 7200;
    claims.exp = claims.iat + 600;
  }
  ctx.body.id_token = await new jose.SignJWT(claims)
    .setProtectedHeader({ alg: 'RS256', kid: jwk.kid, typ: 'JWT' })
    .sign(privateKey);
});

const page = (body) => `<!doctype html><html><head><title>Test provider</title></head><body>${body}</body></html>`;

async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  const { uid, prompt, params, session } = details;
  if (prompt.name === 'consent') {
    // consent is implied: the platform's own client
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(' '));
    if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
    const grantId = await grant.save();
    return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  }
  if (req.method === 'POST') {
    const form = new URLSearchParams(await new Promise((resolve) => {
      let data = '';
      req.on('data', (chunk) => { data += chunk; });
      req.on('end', () => resolve(data));
    }));
    const login = form.get('login') || '';
    const user = users()[login];
    if (user && user.password === form.get('password')) {
      const amr = user.mfa ? ['pwd', 'otp', 'mfa'] : ['pwd'];
      return provider.interactionFinished(req, res, { login: { accountId: login, amr } }, { mergeWithLastSubmission: false });
    }
    res.writeHead(200, { 'content-type': 'text/html' });
    return res.end(page(`<p id="op-error">Wrong user or password.</p>${loginForm(uid)}`));
  }
  res.writeHead(200, { 'content-type': 'text/html' });
  return res.end(page(loginForm(uid)));
}

const loginForm = (uid) => `<h1>Test provider</h1><form method="post" action="/interaction/${uid}">
<label>User <input name="login" id="op-login"></label>
<label>Password <input name="password" type="password" id="op-password"></label>
<button type="submit" id="op-submit">Sign in</button></form>`;

const callback = provider.callback();
http
  .createServer((req, res) => {
    if (req.url === '/favicon.ico') {
      res.writeHead(204);
      res.end();
      return;
    }
    if (req.url.startsWith('/interaction/')) {
      interaction(req, res).catch((err) => {
        res.writeHead(400, { 'content-type': 'text/plain' });
        res.end(String(err));
      });
      return;
    }
    callback(req, res);
  })
  .listen(port, '127.0.0.1', () => console.log(`oidc-provider ready on ${issuer}`));

for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
