"""The results tables: a text table printed and written beside its JSON (and CSV) document, as
bench/fidelity/results/ holds them."""
import csv
import json
import os


def out_dir(out):
    """OUT, made if missing."""
    os.makedirs(out, exist_ok=True)
    return out


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def write_json(path, doc, newline=False):
    """DOC indented by one space; NEWLINE: a final newline (the older tables have none)."""
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        if newline:
            f.write("\n")


def write_csv_rows(path, header, rows):
    """A header and rows of values (csv.writer)."""
    with open(path, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(header)
        wr.writerows(rows)


def write_csv_dicts(path, fieldnames, rows):
    """Dict rows under FIELDNAMES; keys not named are left out, missing ones empty."""
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fieldnames, extrasaction="ignore")
        wr.writeheader()
        wr.writerows(rows)


def write_table(out, name, lines, doc, json_newline=False):
    """Prints LINES and writes them to OUT/NAME.txt (newline-terminated), and DOC to
    OUT/NAME.json. Returns the text."""
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out_dir(out)
    write_text(os.path.join(out, name + ".txt"), text)
    write_json(os.path.join(out, name + ".json"), doc, newline=json_newline)
    return text
