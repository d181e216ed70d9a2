package identity

import (
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// DefaultTTL is the lifetime of minted tokens when the request leaves it
// zero: long enough for a dev session, short enough that a leaked dev token
// soon stops working.
const DefaultTTL = time.Hour

// MintRequest describes a dev token. Set Agent to mint an agent token for
// User; leave it empty for a plain user token.
type MintRequest struct {
	// Issuer becomes `iss`; it must be one of the Verifier's Issuers.
	Issuer string
	// Audience becomes `aud`; it must be one of the Verifier's Audience.
	Audience string
	// User becomes `sub`. Required.
	User string
	// Tenant and Org become `tenant` and `org`. Tenant is required.
	Tenant string
	Org    string
	// Agent, Model and ModelVersion become the RFC 8693 `act` claim.
	Agent        string
	Model        string
	ModelVersion string
	// TTL defaults to DefaultTTL.
	TTL time.Duration
	// Now defaults to time.Now(); tests set it to mint tokens that are
	// already expired or not yet valid.
	Now time.Time
}

// mintClaims is what MintDev and MintService serialise; omitempty keeps
// user tokens free of service claims and vice versa.
type mintClaims struct {
	Issuer    string           `json:"iss"`
	Subject   string           `json:"sub"`
	Audience  jwt.Audience     `json:"aud"`
	Expiry    *jwt.NumericDate `json:"exp"`
	NotBefore *jwt.NumericDate `json:"nbf"`
	IssuedAt  *jwt.NumericDate `json:"iat"`
	ID        string           `json:"jti"`
	Tenant    string           `json:"tenant,omitempty"`
	Org       string           `json:"org,omitempty"`
	Act       *actClaim        `json:"act,omitempty"`
	Service   string           `json:"mandate_service,omitempty"`
}

// MintDev signs an HS256 user or agent token with the dev secret. It exists
// for `mandate dev` and tests; production tokens come from an identity
// provider. Each token gets a random `jti` so audit records can tell two
// tokens for the same user apart.
func MintDev(secret []byte, r MintRequest) (string, error) {
	switch {
	case r.Issuer == "" || r.Audience == "":
		return "", errors.New("identity: MintDev needs Issuer and Audience")
	case r.User == "" || r.Tenant == "":
		return "", errors.New("identity: MintDev needs User and Tenant")
	case r.Agent == "" && (r.Model != "" || r.ModelVersion != ""):
		return "", errors.New("identity: Model and ModelVersion need an Agent")
	}
	c := baseClaims(r.Issuer, r.Audience, r.User, r.TTL, r.Now)
	c.Tenant = r.Tenant
	c.Org = r.Org
	if r.Agent != "" {
		c.Act = &actClaim{Subject: r.Agent, Model: r.Model, ModelVersion: r.ModelVersion}
	}
	return signHS256(secret, c)
}

func baseClaims(issuer, audience, subject string, ttl time.Duration, now time.Time) mintClaims {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if now.IsZero() {
		now = time.Now()
	}
	return mintClaims{
		Issuer:    issuer,
		Subject:   subject,
		Audience:  jwt.Audience{audience},
		Expiry:    jwt.NewNumericDate(now.Add(ttl)),
		NotBefore: jwt.NewNumericDate(now),
		IssuedAt:  jwt.NewNumericDate(now),
		ID:        rand.Text(),
	}
}

func signHS256(secret []byte, c mintClaims) (string, error) {
	if len(secret) < MinSecretBytes {
		return "", fmt.Errorf("identity: secret must be at least %d bytes", MinSecretBytes)
	}
	signer, err := jose.NewSigner(
		jose.SigningKey{Algorithm: jose.HS256, Key: secret},
		(&jose.SignerOptions{}).WithType("JWT"),
	)
	if err != nil {
		return "", fmt.Errorf("identity: signer: %w", err)
	}
	tok, err := jwt.Signed(signer).Claims(c).Serialize()
	if err != nil {
		return "", fmt.Errorf("identity: sign: %w", err)
	}
	return tok, nil
}
