package admincli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/control/adminclient"
	"github.com/sluicehq/sluice/policy"
)

// Exit codes of sluice admin, so that scripts can branch without parsing messages. 2 is taken
// by sluice check (denied).
const (
	exitGeneral  = 1 // bad flags, bad input (HTTP 400), the server unreachable or failing
	exitNotFound = 3 // HTTP 404: no such rule, override, exemption, identity or token
	exitConflict = 4 // HTTP 409 (exists already, file resource, last admin) or 412 (If-Match)
	exitAuth     = 5 // no token, HTTP 401 (unknown token), 403 (weaker role), 429 (auth failures)
)

// Where sluice admin finds its server and token when no flag gives them.
const (
	defaultAdminServer = "http://127.0.0.1:8080"
	envServer          = "SLUICE_SERVER"
	envToken           = "SLUICE_TOKEN"
	// envAdminToken is the server's own bootstrap variable: on a node where it is set, the CLI
	// works without more setup.
	envAdminToken = "SLUICE_ADMIN_TOKEN"
	// envDataDir is serve's --data-dir variable: the folder where a node started without a
	// bootstrap token wrote one (admin.token), "data" by default.
	envDataDir = "SLUICE_DATA_DIR"
)

// bootstrapTokenFile is where serve, started in the same folder with the same environment,
// wrote its bootstrap admin token: the last place the CLI looks, so that the README's first
// steps need no setup.
func bootstrapTokenFile() string {
	dir := os.Getenv(envDataDir)
	if dir == "" {
		dir = "data"
	}
	return filepath.Join(dir, "admin.token")
}

// adminOptions are the flags every sluice admin command shares, and the clock its relative
// times ("--since 1h") count from.
type adminOptions struct {
	server    string
	token     string
	tokenFile string
	output    string
	timeout   time.Duration
	verbose   bool
	wait      bool
	now       func() time.Time
	version   string
}

const adminLong = `Change and inspect a running Sluice fleet through its admin API (/admin/v1).

The server is --server, else $SLUICE_SERVER, else http://127.0.0.1:8080.
The token is --token-file FILE or --token TOKEN (not both), else $SLUICE_TOKEN, else
$SLUICE_ADMIN_TOKEN (the server's bootstrap token), else the file a node started without one
wrote, ./data/admin.token ($SLUICE_DATA_DIR/admin.token when set; a note on stderr says it was
used). Prefer the file or the environment: a --token on the command line shows in process
listings.

Output is a table for people (times in RFC 3339, UTC) or, with -o json, the server's JSON as
it is. Changes print the policy version that includes them; compare it with "sluice admin
nodes" to see it enforced everywhere.

Exit codes: 0 done; 1 bad input or flags (HTTP 400), server unreachable or failing; 3 not found
(404); 4 conflict or If-Match precondition failed (409, 412); 5 authentication: no token, an
unknown one (401), a weaker role (403), too many failed attempts (429).`

// Command builds `sluice admin`; version goes into the client's User-Agent.
func Command(version string) *cobra.Command { return newAdminCommand(version, time.Now) }

// newAdminCommand builds sluice admin with the clock relative times count from.
func newAdminCommand(version string, now func() time.Time) *cobra.Command {
	o := &adminOptions{now: now, version: version}
	cmd := group("admin", "Change and inspect a running fleet: rules, overrides, exemptions, identities, tokens, audit, usage")
	cmd.Long = adminLong
	cmd.Example = `  export SLUICE_SERVER=http://10.0.0.5:8080 SLUICE_TOKEN=$(cat data/admin.token)
  sluice admin rules list
  sluice admin overrides create --tenant acme --type ban --ttl 1h --reason "abuse ticket 42"
  sluice admin identities set api_key k-123 --tier premium --tenant acme
  sluice admin audit --since 24h --kind override -o json`
	pf := cmd.PersistentFlags()
	pf.StringVar(&o.server, "server", "", "admin API base URL (default $"+envServer+", else "+defaultAdminServer+")")
	pf.StringVar(&o.token, "token", "", "bearer token (default $"+envToken+", else $"+envAdminToken+"); visible in process listings, prefer --token-file")
	pf.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token, such as <data-dir>/admin.token")
	pf.StringVarP(&o.output, "output", "o", "table", "output format: table or json (the server's JSON, as is)")
	pf.DurationVar(&o.timeout, "timeout", 10*time.Second, "deadline of each call to the server")
	pf.BoolVar(&o.wait, "wait", false, "changes answer only once every live node enforces them (Sluice-Wait: fleet); past the server's --wait-timeout the change is stored and the command fails naming the nodes that lag")
	pf.BoolVarP(&o.verbose, "verbose", "v", false, "print each request and the answer's status and headers on stderr (never the token)")
	cmd.AddCommand(
		rulesCommand(o),
		overridesCommand(o),
		exemptionsCommand(o),
		identitiesCommand(o),
		domainsCommand(o),
		tokensCommand(o),
		auditCommand(o),
		usageCommand(o),
		violationsCommand(o),
		nodesCommand(o),
		statsCommand(o),
		topCommand(o),
		resetCommand(o),
		exportCommand(o),
		importCommand(o),
	)
	return cmd
}

// client checks the shared flags and returns a client for the server they name.
func (o *adminOptions) client(cmd *cobra.Command) (*adminClient, error) {
	switch o.output {
	case "table", "json":
	default:
		return nil, fmt.Errorf("--output %q: want table or json", o.output)
	}
	if o.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %s: must be > 0", o.timeout)
	}
	base, err := serverURL(o.server)
	if err != nil {
		return nil, err
	}
	tok, from, err := o.resolveToken(cmd.Flags().Changed("token"))
	if err != nil {
		return nil, err
	}
	if from == bootstrapTokenFile() {
		// Said, not silent: the token of whichever server last wrote this folder is used.
		fmt.Fprintf(cmd.ErrOrStderr(), "sluice admin: using the bootstrap token in %s (no --token-file, --token, $%s or $%s)\n", from, envToken, envAdminToken)
	}
	c := &adminClient{Base: base, Token: tok, TokenFrom: from, Timeout: o.timeout, UserAgent: "sluice-cli/" + o.version, WaitFleet: o.wait}
	if o.verbose {
		c.Verbose = cmd.ErrOrStderr()
	}
	return c, nil
}

// serverURL resolves --server, then SLUICE_SERVER, then the default, to a base URL without a
// trailing slash. A bare host:port means http.
func serverURL(flag string) (string, error) {
	s, name := flag, "--server"
	if s == "" {
		s, name = os.Getenv(envServer), envServer
	}
	if s == "" {
		s = defaultAdminServer
	}
	base, err := adminclient.BaseURL(s)
	if err != nil {
		return "", fmt.Errorf("%s %w", name, err)
	}
	return base, nil
}

// resolveToken finds the token in the documented order and says where it came from. Errors
// never quote the token.
func (o *adminOptions) resolveToken(flagGiven bool) (token, from string, _ error) {
	if o.tokenFile != "" && flagGiven {
		return "", "", ExitError{Code: exitGeneral, Msg: "give --token or --token-file, not both"}
	}
	switch {
	case o.tokenFile != "":
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return "", "", ExitError{Code: exitAuth, Msg: fmt.Sprintf("--token-file: %v", err)}
		}
		token, from = string(b), "--token-file "+o.tokenFile
	case flagGiven:
		token, from = o.token, "--token"
	case os.Getenv(envToken) != "":
		token, from = os.Getenv(envToken), envToken
	case os.Getenv(envAdminToken) != "":
		token, from = os.Getenv(envAdminToken), envAdminToken
	default:
		path := bootstrapTokenFile()
		b, err := os.ReadFile(path)
		if err != nil {
			return "", "", ExitError{Code: exitAuth, Msg: fmt.Sprintf("no token: give --token-file FILE, --token, or set %s (%s: %v)", envToken, path, errors.Unwrap(err))}
		}
		token, from = string(b), path
	}
	token = strings.TrimSpace(token) // a file's last newline
	if token == "" {
		return "", "", ExitError{Code: exitAuth, Msg: from + ": empty token"}
	}
	for _, r := range token {
		if r < 0x21 || r == 0x7f {
			return "", "", ExitError{Code: exitAuth, Msg: from + ": the token holds spaces or control characters"}
		}
	}
	return token, from, nil
}

// relTime reads a time flag: RFC 3339 as it is, or a duration ("90m", "7d") meaning that long
// before now. Anything else goes to the server unchanged, whose answer names the field.
func (o *adminOptions) relTime(v string) string {
	if _, err := time.Parse(time.RFC3339, v); err == nil {
		return v
	}
	if d, err := policy.ParseDuration(v); err == nil && d >= 0 {
		return o.now().Add(-d).UTC().Format(time.RFC3339)
	}
	return v
}

// jsonOut reports whether -o json was asked for.
func (o *adminOptions) jsonOut() bool { return o.output == "json" }

// out is where a command's results go.
func out(cmd *cobra.Command) io.Writer { return cmd.OutOrStdout() }

// run wraps a command's work: it checks the shared flags, builds the client, and passes both
// on.
func (o *adminOptions) run(f func(cmd *cobra.Command, c *adminClient, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := o.client(cmd)
		if err != nil {
			return err
		}
		return f(cmd, c, args)
	}
}

// showList prints a list answer: as is with -o json, else the table of body[key].
func (o *adminOptions) showList(cmd *cobra.Command, a *answer, key string, cols []column) error {
	if o.jsonOut() {
		return writeRaw(out(cmd), a.Body)
	}
	return printList(out(cmd), a.Body, key, cols)
}

// showResource prints one resource, read or changed: as is with -o json, else its fields,
// its ETag (for --if-match) and, for a change, the policy version that includes it.
func (o *adminOptions) showResource(cmd *cobra.Command, a *answer) error {
	if o.jsonOut() {
		return writeRaw(out(cmd), a.Body)
	}
	return printObject(out(cmd), a.Body, [2]string{"etag", a.ETag()}, [2]string{"policy_version", a.PolicyVersion()})
}

// showDeleted reports a deletion, which answers 204 without a body: a line for people, and
// for scripts the one fact the answer carries, {"policy_version": "..."}.
func (o *adminOptions) showDeleted(cmd *cobra.Command, what string, a *answer) error {
	if o.jsonOut() {
		b, _ := json.Marshal(map[string]string{"policy_version": a.PolicyVersion()})
		return writeRaw(out(cmd), b)
	}
	_, err := fmt.Fprintf(out(cmd), "deleted %s (policy version %s)\n", sanitize(what), sanitize(a.PolicyVersion()))
	return err
}

// changeFlagsOf registers --if-match and --reason on a change.
func changeFlagsOf(cmd *cobra.Command) *changeFlags {
	ch := &changeFlags{}
	cmd.Flags().StringVar(&ch.IfMatch, "if-match", "", `change only if the resource's ETag is still this (as "get" shows it); * = only if it exists`)
	cmd.Flags().StringVar(&ch.Reason, "reason", "", "why, for the audit log")
	return ch
}

// bodyFromFlags copies the flags among names that were given into body, each under its name
// with - turned to _. The server validates the values; only what JSON cannot carry (a NaN or
// an infinity, which the flag parser accepts) is refused here.
func bodyFromFlags(cmd *cobra.Command, body *object, names ...string) error {
	f := cmd.Flags()
	for _, n := range names {
		fl := f.Lookup(n)
		if fl == nil || !fl.Changed {
			continue
		}
		field := strings.ReplaceAll(n, "-", "_")
		switch fl.Value.Type() {
		case "float64":
			v, _ := f.GetFloat64(n)
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("--%s %s: want a finite number", n, fl.Value.String())
			}
			body.Set(field, v)
		case "int64":
			v, _ := f.GetInt64(n)
			body.Set(field, v)
		case "bool":
			v, _ := f.GetBool(n)
			body.Set(field, v)
		default:
			body.Set(field, fl.Value.String())
		}
	}
	return nil
}

// queryFromFlags builds a query of the flags among names that were given non-empty, each
// under its name with - turned to _. Flags in times take a duration for "that long ago".
func (o *adminOptions) queryFromFlags(cmd *cobra.Command, times []string, names ...string) url.Values {
	q := url.Values{}
	f := cmd.Flags()
	for _, n := range names {
		fl := f.Lookup(n)
		if fl == nil || !fl.Changed || fl.Value.String() == "" {
			continue
		}
		v := fl.Value.String()
		if slices.Contains(times, n) {
			v = o.relTime(v)
		}
		q.Set(strings.ReplaceAll(n, "-", "_"), v)
	}
	return q
}

// keyValues reads repeated key=value flags into a map.
func keyValues(flag string, kvs []string) (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want key=value", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

// group returns a command that only holds subcommands. Without a Run of its own, cobra would
// answer a mistyped subcommand with the help and exit 0; scripts must see the mistake.
func group(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unknown command %q for %q; see %s --help", args[0], cmd.CommandPath(), cmd.CommandPath())
			}
			return cmd.Help()
		},
	}
}
