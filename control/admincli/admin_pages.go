package admincli

import (
	"github.com/spf13/cobra"

	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
)

// maxPages bounds how many pages getAll follows, so a server that keeps answering next
// cannot keep the command running forever: 10,000 pages of the default 1,000 items.
const maxPages = 10_000

// getAll reads a paged list (issue 29): with limit > 0, the one page of that size, as the
// server answered it (next included, for a script to follow); else every page, following
// next, joined into one answer of the items under key.
func getAll(ctx context.Context, c *adminClient, path string, q url.Values, key string, limit int) (*answer, error) {
	if limit < 0 {
		return nil, fmt.Errorf("--limit %d: must be 0 (every page) or more", limit)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
		return c.Get(ctx, path, q)
	}
	var items []json.RawMessage
	var last *answer
	for range maxPages {
		a, err := c.Get(ctx, path, q)
		if err != nil {
			return nil, err
		}
		last = a
		var page struct {
			Next string `json:"next"`
		}
		var body map[string]json.RawMessage
		if err := json.Unmarshal(a.Body, &body); err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		var these []json.RawMessage
		if err := json.Unmarshal(body[key], &these); err != nil {
			return nil, fmt.Errorf("read %s: %s: %w", path, key, err)
		}
		items = append(items, these...)
		if err := json.Unmarshal(a.Body, &page); err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		if page.Next == "" {
			if items == nil {
				items = []json.RawMessage{}
			}
			b, err := json.Marshal(map[string]any{key: items})
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", path, err)
			}
			joined := *last
			joined.Body = b
			return &joined, nil
		}
		q.Set("after", page.Next)
	}
	return nil, fmt.Errorf("read %s: more than %d pages", path, maxPages)
}

// listCommand is the "list" command of a paged list at path whose answer holds its items
// under key: every page joined (following next), or with --limit one page and its next, for
// --after. filters names the list's own flags, sent as query parameters; the caller adds them.
func (o *adminOptions) listCommand(short, path, key string, cols []column, filters ...string) *cobra.Command {
	list := &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: short, Args: cobra.NoArgs,
		RunE: o.run(func(cmd *cobra.Command, c *adminClient, _ []string) error {
			q := o.queryFromFlags(cmd, nil, append(filters, "after")...)
			limit, _ := cmd.Flags().GetInt("limit")
			a, err := getAll(cmd.Context(), c, path, q, key, limit)
			if err != nil {
				return err
			}
			return o.showList(cmd, a, key, cols)
		}),
	}
	f := list.Flags()
	f.Int("limit", 0, "one page of at most this many (its next, with -o json, is the cursor for --after); 0: every page")
	f.String("after", "", "with --limit, the page after this cursor (the previous page's next)")
	return list
}
