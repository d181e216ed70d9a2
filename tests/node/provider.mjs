// The OAuth client provider the test hosts (oauth.mjs, idp.mjs) use: in
// memory, one per server, as an MCP host keeps it. onAuthorize receives the
// authorization URL the SDK would open in a browser.
import { randomBytes } from "node:crypto";

export class MemoryOAuthProvider {
  constructor({ redirectUrl, clientName, onAuthorize }) {
    this.redirect = redirectUrl;
    this.clientName = clientName;
    this.onAuthorize = onAuthorize;
    this.expectedState = "st-" + randomBytes(12).toString("base64url");
  }
  get redirectUrl() {
    return this.redirect;
  }
  get clientMetadata() {
    return {
      client_name: this.clientName,
      redirect_uris: [this.redirect],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  }
  state() {
    return this.expectedState;
  }
  clientInformation() {
    return this.client;
  }
  saveClientInformation(info) {
    this.client = info;
  }
  tokens() {
    return this.savedTokens;
  }
  saveTokens(tokens) {
    this.savedTokens = tokens;
  }
  redirectToAuthorization(url) {
    this.onAuthorize(url);
  }
  saveCodeVerifier(v) {
    this.verifier = v;
  }
  codeVerifier() {
    return this.verifier;
  }
  saveDiscoveryState(s) {
    this.discovery = s;
  }
  discoveryState() {
    return this.discovery;
  }
}
