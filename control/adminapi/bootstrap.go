package adminapi

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/sluicehq/sluice/control"
)

// BootstrapTokenName is the admin token that Bootstrap manages.
const BootstrapTokenName = "bootstrap"

// TokenFileName is the file in the data directory that a generated bootstrap token is
// written to.
const TokenFileName = "admin.token"

// bootstrapActor is the audit actor of Bootstrap's changes.
const bootstrapActor = "bootstrap"

// minSecretLen is the shortest secret Bootstrap takes without a warning.
const minSecretLen = 16

// BootstrapOptions say where the first admin token comes from.
type BootstrapOptions struct {
	// Secret is the bootstrap token's secret: SLUICE_ADMIN_TOKEN, or the content of
	// --admin-token-file. Surrounding white space (a file's last newline) is dropped.
	// Empty: generate one at first start.
	Secret string
	// DataDir is where a generated secret is written, as TokenFileName with mode 0600.
	DataDir string
	// Log is told what happened (paths, never a secret); slog.Default() when nil.
	Log *slog.Logger
}

// Bootstrap ensures an admin can reach the admin API. With a Secret, the admin token named
// "bootstrap" has that secret: it is created, or replaced when the secret (or its role)
// changed, unless a token with that secret was deleted through the API (revoked): then it
// stays revoked, and the log says to give a new secret. Without one, and only when the store holds no token at all (a first start), a
// random secret is written to <DataDir>/admin.token (mode 0600) and stored as the "bootstrap"
// admin token; the file's path is logged, never the secret. It returns the path of a file it
// wrote, or "".
//
// On a fleet sharing one PostgreSQL store, nodes starting together race: one stores its token,
// the others find it taken, remove the file they wrote, and log where the token is.
func Bootstrap(ctx context.Context, store control.Store, o BootstrapOptions) (string, error) {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	secret := strings.TrimSpace(o.Secret)
	if secret != "" {
		return "", bootstrapSecret(ctx, store, secret, log)
	}
	toks, err := store.ListTokens(ctx)
	if err != nil {
		return "", fmt.Errorf("bootstrap admin token: %w", err)
	}
	if len(toks) > 0 {
		return "", nil
	}
	if o.DataDir == "" {
		return "", errors.New("bootstrap admin token: no token exists and there is no data directory to write one to; set SLUICE_ADMIN_TOKEN")
	}
	secret, err = NewSecret()
	if err != nil {
		return "", fmt.Errorf("bootstrap admin token: %w", err)
	}
	path := filepath.Join(o.DataDir, TokenFileName)
	// The file is written before the token is stored: a token stored but never written would
	// lock everyone out, since a store with a token is not a first start any more.
	if err := writeSecret(path, secret); err != nil {
		return "", fmt.Errorf("bootstrap admin token: %w", err)
	}
	_, err = store.CreateToken(ctx, control.Change{Actor: bootstrapActor, Reason: "first start: generated admin token"},
		control.Token{Name: BootstrapTokenName, Role: control.RoleAdmin, Hash: control.HashToken(secret)})
	if errors.Is(err, control.ErrConflict) {
		os.Remove(path)
		log.Warn("another node created the bootstrap admin token first; it is in that node's data directory", "file", TokenFileName)
		return "", nil
	}
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("bootstrap admin token: %w", err)
	}
	log.Info("generated the bootstrap admin token; read it from the file (it is not logged)", "path", path)
	return path, nil
}

// bootstrapSecret makes the "bootstrap" token an admin token with secret.
func bootstrapSecret(ctx context.Context, store control.Store, secret string, log *slog.Logger) error {
	if len(secret) < minSecretLen {
		log.Warn("the admin token from SLUICE_ADMIN_TOKEN or --admin-token-file is short; use 32 random characters or more", "length", len(secret))
	}
	h := control.HashToken(secret)
	tok, err := store.GetToken(ctx, BootstrapTokenName)
	switch {
	case err == nil && subtle.ConstantTimeCompare(tok.Hash[:], h[:]) == 1 && tok.Role == control.RoleAdmin:
		return nil
	case err != nil && !errors.Is(err, control.ErrNotFound):
		return fmt.Errorf("bootstrap admin token: %w", err)
	}
	// A secret whose token was deleted through the API stays revoked: recreating it at every
	// start would undo the revocation. The operator gives a new secret to get a bootstrap
	// token back.
	revoked, err := store.TokenRevoked(ctx, h)
	if err != nil {
		return fmt.Errorf("bootstrap admin token: %w", err)
	}
	if revoked {
		log.Warn("the admin token from SLUICE_ADMIN_TOKEN or --admin-token-file was revoked through the admin API and stays revoked; give a new secret to have a bootstrap token again")
		return nil
	}
	// Created, or the secret rotated: replaced in one transaction (audited without secrets or
	// hashes), so the fleet is never without the token in between.
	_, err = store.ReplaceToken(ctx, control.Change{Actor: bootstrapActor, Reason: "admin token from the environment or file"},
		control.Token{Name: BootstrapTokenName, Role: control.RoleAdmin, Hash: h})
	if errors.Is(err, control.ErrConflict) {
		// Another token has this secret already (never say which).
		return errors.New("bootstrap admin token: the given secret is already another token's; choose another")
	}
	if err != nil {
		return fmt.Errorf("bootstrap admin token: %w", err)
	}
	log.Info("admin token \"bootstrap\" set from SLUICE_ADMIN_TOKEN or --admin-token-file")
	return nil
}

// writeSecret writes secret to path with mode 0600, creating its folder with mode 0700. It
// writes a temporary file and renames it, so a reader never sees half a token and an older
// file with looser permissions is replaced, not reused.
func writeSecret(path, secret string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".admin.token-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a successful rename this finds nothing
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(secret + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
