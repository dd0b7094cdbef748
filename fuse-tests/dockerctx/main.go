// dockerctx checks a Dockerfile's build context the way Docker itself reads it: the Dockerfile
// is parsed by BuildKit's own parser (github.com/moby/buildkit/frontend/dockerfile), the
// context's .dockerignore by Docker's own matcher (github.com/moby/patternmatcher and its
// ignorefile reader). Every COPY and ADD source that comes from the build context (no --from,
// no URL, no heredoc) must name at least one file that is in the context after .dockerignore:
// the check that `docker buildx build -f DOCKERFILE CONTEXT` would otherwise fail at its COPY.
//
// Usage: dockerctx -f DOCKERFILE [-context DIR]   (DIR defaults to the current directory)
//
// Exit status: 0 when every source is present, 1 when one is missing (each printed on stderr
// with its line), 2 on usage errors or an unreadable Dockerfile or .dockerignore.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// source is one COPY/ADD source read from the build context.
type source struct {
	line int
	cmd  string
	path string
}

func main() {
	dockerfile := flag.String("f", "", "the Dockerfile")
	context := flag.String("context", ".", "the build context (its .dockerignore applies)")
	flag.Parse()
	if *dockerfile == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: dockerctx -f DOCKERFILE [-context DIR]")
		os.Exit(2)
	}
	srcs, err := contextSources(*dockerfile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dockerctx: %s: %v\n", *dockerfile, err)
		os.Exit(2)
	}
	files, err := contextFiles(*context)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dockerctx: context %s: %v\n", *context, err)
		os.Exit(2)
	}
	missing := 0
	for _, s := range srcs {
		if !present(files, s.path) {
			fmt.Fprintf(os.Stderr, "%s:%d: %s source %q is not in the build context after .dockerignore\n",
				*dockerfile, s.line, s.cmd, s.path)
			missing++
		}
	}
	fmt.Printf("%s: %d context sources, %d missing, %d files in the context\n",
		*dockerfile, len(srcs), missing, len(files))
	if missing > 0 {
		os.Exit(1)
	}
}

// contextSources parses the Dockerfile with BuildKit's parser and returns the sources of every
// COPY and ADD that read the build context.
func contextSources(dockerfile string) ([]source, error) {
	f, err := os.Open(dockerfile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ast, err := parser.Parse(f)
	if err != nil {
		return nil, err
	}
	stages, _, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		return nil, err
	}
	var out []source
	for _, st := range stages {
		for _, c := range st.Commands {
			switch c := c.(type) {
			case *instructions.CopyCommand:
				if c.From == "" {
					out = append(out, sources("COPY", c.Location(), c.SourcePaths)...)
				}
			case *instructions.AddCommand:
				var local []string
				for _, p := range c.SourcePaths {
					if !strings.Contains(p, "://") && !strings.HasPrefix(p, "git@") {
						local = append(local, p)
					}
				}
				out = append(out, sources("ADD", c.Location(), local)...)
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no COPY or ADD reads the build context")
	}
	return out, nil
}

func sources(cmd string, loc []parser.Range, paths []string) []source {
	line := 0
	if len(loc) > 0 {
		line = loc[0].Start.Line
	}
	out := make([]source, 0, len(paths))
	for _, p := range paths {
		out = append(out, source{line: line, cmd: cmd, path: p})
	}
	return out
}

// contextFiles lists the files (slash-separated, relative to dir) that the build context holds
// after .dockerignore, with Docker's matcher (a path is left out when it or a parent matches,
// unless a later ! pattern takes it back).
func contextFiles(dir string) ([]string, error) {
	var patterns []string
	if f, err := os.Open(filepath.Join(dir, ".dockerignore")); err == nil {
		patterns, err = ignorefile.ReadAll(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf(".dockerignore: %w", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	var files []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		excluded, err := pm.MatchesOrParentMatches(rel)
		if err != nil {
			return err
		}
		if d.IsDir() {
			// A directory left out whole is skipped unless an exception could take part of it back.
			if excluded && !pm.Exclusions() {
				return filepath.SkipDir
			}
			return nil
		}
		if !excluded {
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

// present reports whether the source (a context path, possibly with wildcards, "." for the
// whole context) names at least one file of the context.
func present(files []string, src string) bool {
	src = strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(src)), "/")
	for _, f := range files {
		if src == "" || f == src || strings.HasPrefix(f, src+"/") {
			return true
		}
		// A wildcard source matches a file, or a directory above it.
		parts := strings.Split(f, "/")
		for i := 1; i <= len(parts); i++ {
			if ok, _ := path.Match(src, strings.Join(parts[:i], "/")); ok {
				return true
			}
		}
	}
	return false
}
