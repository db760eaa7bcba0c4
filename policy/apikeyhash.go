package policy

import (
	"strings"

	"github.com/sluicehq/sluice/internal/key"
)

// apiKeyHash returns the hashed API key an override's api_key_hash names, lowercased, or
// why it cannot be one. The hash is what violations, usage and the abuse detector show of a
// key; an override by hash matches the requests whose key hashes to it, as api_key does.
func apiKeyHash(o *Override) (hash, msg string) {
	h := strings.ToLower(o.APIKeyHash)
	switch {
	case o.APIKey != "":
		return "", "names the same target as api_key: give one of them"
	case !key.IsHashedAPIKey(h):
		return "", "must be '#' and 32 hex digits, as violations and usage show an API key"
	}
	return h, ""
}
