// A real OpenID provider for tests/proxy_auth.rs: oidc-provider (npm) with the client_credentials
// grant issuing access tokens for the proxy (audience `switchyard-proxy`), signed with a fresh RSA
// key whose kid is given; introspection on. Args: port kid.
import Provider from 'oidc-provider';
import { generateKeyPair, exportJWK } from 'jose';

const [port, kid] = process.argv.slice(2);
const { privateKey } = await generateKeyPair('RS256', { extractable: true });
const jwk = { ...(await exportJWK(privateKey)), kid, alg: 'RS256', use: 'sig' };
const client = (id, secret) => ({
  client_id: id, client_secret: secret, grant_types: ['client_credentials'],
  redirect_uris: [], response_types: [],
});
const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [client('switchyard-proxy', 'proxy-secret'), client('laptop', 'laptop-secret')],
  jwks: { keys: [jwk] },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => 'urn:switchyard:proxy',
      useGrantedResource: () => true,
      // scope `short`: a token valid for 2 s; scope `opaque`: an opaque (introspectable) token.
      getResourceServerInfo: (ctx) => {
        const scope = String(ctx.oidc.params?.scope ?? '');
        return {
          scope: 'proxy short opaque', audience: 'switchyard-proxy',
          accessTokenFormat: scope.includes('opaque') ? 'opaque' : 'jwt',
          accessTokenTTL: scope.includes('short') ? 2 : 600,
        };
      },
    },
  },
});
provider.listen(Number(port), '127.0.0.1', () => console.log('listening'));
