package console

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/kfpipe/kfpipe/internal/config"
)

// principal is the caller a token identifies.
type principal struct {
	name string
	role string
}

type principalKey struct{}

func withPrincipal(ctx context.Context, p principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

func principalFrom(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}

type tokenEntry struct {
	sum  [sha256.Size]byte
	name string
	role string
}

// authenticator compares a presented token with every configured one.
// Both sides are hashed first so the comparison always runs over 32 bytes
// whatever the lengths (ConstantTimeCompare returns early on a length
// mismatch), and the loop visits every entry without branching on a match,
// so timing says neither whether nor which token matched.
type authenticator struct {
	tokens []tokenEntry
}

func newAuthenticator(tokens []config.AdminToken) *authenticator {
	a := &authenticator{}
	for _, t := range tokens {
		a.tokens = append(a.tokens, tokenEntry{sum: sha256.Sum256([]byte(t.Token)), name: t.Name, role: t.Role})
	}
	return a
}

// lookup returns the index of the matching token or -1.
func (a *authenticator) lookup(token string) int {
	sum := sha256.Sum256([]byte(token))
	match := -1
	for i := range a.tokens {
		eq := subtle.ConstantTimeCompare(sum[:], a.tokens[i].sum[:])
		match = subtle.ConstantTimeSelect(eq, i, match)
	}
	return match
}

// authenticate reads the bearer token of r.
func (a *authenticator) authenticate(r *http.Request) (principal, *apiError) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return principal{}, &apiError{Status: http.StatusUnauthorized, Msg: "missing bearer token",
			challenge: `Bearer realm="kfpipe-admin"`}
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t") {
		return principal{}, &apiError{Status: http.StatusUnauthorized, Msg: "malformed Authorization header: want Bearer <token>",
			challenge: `Bearer realm="kfpipe-admin", error="invalid_request"`}
	}
	i := a.lookup(token)
	if i < 0 {
		return principal{}, &apiError{Status: http.StatusUnauthorized, Msg: "invalid token",
			challenge: `Bearer realm="kfpipe-admin", error="invalid_token"`}
	}
	return principal{name: a.tokens[i].name, role: a.tokens[i].role}, nil
}
