package admincli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/control"
)

// sluice admin export writes YAML that sluice admin import reads back: without --apply it
// prints the diff and changes nothing; with it, the entries are created, and an import of the
// same document again changes nothing. Strings that YAML would read as something else stay
// strings.
func TestAdminExportImport(t *testing.T) {
	e := newAdminEnv(t)
	for _, args := range [][]string{
		{"overrides", "create", "--tenant", "acme", "--type", "multiplier", "--value", "2", "--ttl", "1h", "--reason", "contract"},
		{"overrides", "create", "--user", "007", "--type", "ban", "--ttl", "1h", "--reason", "yes"},
		{"identities", "set", "api_key", "true", "--tier", "gold", "--tenant", "acme"},
	} {
		if r := e.admin(control.RoleWrite, "", args...); r.code != 0 {
			t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
		}
	}
	r := e.admin(control.RoleRead, "", "export")
	if r.code != 0 {
		t.Fatalf("export: exit %d: %s", r.code, r.stderr)
	}
	doc := r.stdout
	for _, want := range []string{"overrides:", "tenant: acme", `user: "007"`, `value: "true"`, "identities:"} {
		if !strings.Contains(doc, want) {
			t.Errorf("export lacks %q:\n%s", want, doc)
		}
	}
	file := filepath.Join(t.TempDir(), "control.yaml")
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := e.admin(control.RoleWrite, "", "import", file); r.code != 0 || !strings.Contains(r.stdout, "would create 0, update 0; 3 unchanged") {
		t.Errorf("import into the same server: exit %d: %s %s", r.code, r.stdout, r.stderr)
	}

	dst := newAdminEnv(t)
	dry := dst.admin(control.RoleWrite, "", "import", file)
	if dry.code != 0 || !strings.Contains(dry.stdout, "would create 3") || !strings.Contains(dry.stdout, `create identity api_key/true`) {
		t.Fatalf("dry run: exit %d: %s %s", dry.code, dry.stdout, dry.stderr)
	}
	if r := dst.admin(control.RoleRead, "", "export"); strings.Contains(r.stdout, "acme") {
		t.Fatal("the dry run imported")
	}
	if r := dst.admin(control.RoleWrite, "", "import", file, "--apply"); r.code != 0 || !strings.Contains(r.stdout, "imported: 3 created") {
		t.Fatalf("import --apply: exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	if r := dst.admin(control.RoleRead, "", "export"); r.stdout != doc {
		t.Errorf("the second server exports\n%s\nthe first\n%s", r.stdout, doc)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("overrides:\n  - {tenant: x, type: ban, ttl: 1h, reason: r}\n  - {tenant: y, type: nope, ttl: 1h, reason: r}\n"), 0o600)
	if r := dst.admin(control.RoleWrite, "", "import", bad, "--apply"); r.code != exitGeneral || !strings.Contains(r.stderr, "overrides[1].type") {
		t.Errorf("a bad entry: exit %d: %s", r.code, r.stderr)
	}
}
